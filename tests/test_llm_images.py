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


@pytest.mark.slow
def test_chat_and_generate_take_images_with_an_encoder(tmp_path) -> None:
    """With its mmproj, LLM.chat takes images in each API's shape (the same image, the same answer: one
    encoder run), and LLM.generate vLLM's {prompt, multi_modal_data} prompt; a bad image is a ValueError."""
    from hitenter.testing.tiny_vision import (
        data_url,
        image_base64,
        sample_image,
        write_tiny_gemma3_with_mmproj,
    )

    text, mmproj = write_tiny_gemma3_with_mmproj(tmp_path)
    rgb = sample_image(40, 30, 7)
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    with LLM(str(text), mmproj=str(mmproj)) as llm:
        shapes = [
            [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": data_url(rgb)}}],
            [{"type": "text", "text": "what is it?"},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image_base64(rgb)}}],
            [{"type": "input_text", "text": "what is it?"}, {"type": "input_image", "image_url": data_url(rgb)}],
            [{"type": "text", "text": "what is it?"}, {"type": "image", "image": rgb}],
        ]
        outs = [llm.chat([{"role": "user", "content": c}], greedy)[0] for c in shapes]
        assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1
        assert llm.engine.vision.runs == 1
        assert len(outs[0].prompt_token_ids) > 16 + len(llm.chat([{"role": "user", "content": "what is it?"}],
                                                                  greedy)[0].prompt_token_ids)
        out = llm.generate({"prompt": "Look: <__media__> what?", "multi_modal_data": {"image": rgb}}, greedy)
        assert len(out[0].outputs[0].token_ids) == 4 and llm.engine.vision.runs == 1
        with pytest.raises(ValueError, match="not fetched"):
            llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://a/b.png"}}]}])
