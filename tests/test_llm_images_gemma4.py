"""LLM.chat with an image part on a Gemma 4 model (tiny random gemma4 + its tiny gemma4v mmproj): the image
laid out between `<|image>` and `<image|>` in the chat template's prompt, answered, the same image in two
APIs' shapes encoded once and answered alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitenter import LLM
from hitenter.sampling_params import SamplingParams


@pytest.mark.slow
def test_chat_takes_an_image_on_gemma4(tmp_path: Path) -> None:
    from hitenter.testing.tiny_families import write_tiny_family
    from hitenter.testing.tiny_gemma4v import write_tiny_gemma4v_mmproj
    from hitenter.testing.tiny_vision import data_url, image_base64, sample_image

    text = write_tiny_family(tmp_path / "tiny-gemma4.gguf", "gemma4", seed=0)
    write_tiny_gemma4v_mmproj(tmp_path / "mmproj-tiny-gemma4.gguf", seed=0)
    rgb = sample_image(100, 70, 2)   # 77 tokens
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    with LLM(str(text)) as llm:   # the mmproj found beside the model
        assert llm.engine.vision is not None
        shapes = [
            [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": data_url(rgb)}}],
            [{"type": "text", "text": "what is it?"},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image_base64(rgb)}}],
        ]
        outs = [llm.chat([{"role": "user", "content": c}], greedy)[0] for c in shapes]
        assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1
        assert len(outs[0].outputs[0].token_ids) == 4 and llm.engine.vision.runs == 1
        ids = list(outs[0].prompt_token_ids)
        tok = llm.engine.tokenizer
        begin, end = tok.encode("<|image>", add_bos=False), tok.encode("<image|>", add_bos=False)
        starts = [i for i in range(len(ids)) if ids[i:i + len(begin)] == begin]
        assert len(starts) == 1
        after = starts[0] + len(begin) + 77
        assert ids[after:after + len(end)] == end
        plain = llm.chat([{"role": "user", "content": "what is it?"}], greedy)[0]
        assert len(ids) == len(plain.prompt_token_ids) + len(begin) + 77 + len(end)
