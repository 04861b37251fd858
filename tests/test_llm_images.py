"""LLM.chat refuses an image for a model without a vision encoder (a chat template would drop it silently)."""

from __future__ import annotations

import pytest

from hitenter import LLM
from hitenter.sampling_params import SamplingParams


def test_chat_with_an_image_is_a_value_error(tiny_llama_path) -> None:
    llm = LLM(str(tiny_llama_path), max_num_seqs=4, max_num_batched_tokens=256)
    try:
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        with pytest.raises(ValueError, match=r"messages\[0\].content\[1\].*no vision encoder"):
            llm.chat([{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}])
        with pytest.raises(ValueError, match=r"conversation 1, messages\[0\].images\[0\]"):
            llm.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi", "images": ["AA=="]}]])
        out = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2))
        assert len(out) == 1
    finally:
        llm.close()
