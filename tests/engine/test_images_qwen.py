"""A Qwen2.5-VL / Qwen3-VL image through the engine (tiny random qwen2vl / qwen3vl text model + its tiny mmproj
found beside it; tests/goldens/vision/qwen25vl.npz, qwen3vl.npz from scripts/make_dynamic_vision_goldens.py):
the prompt laid out as mtmd lays it out (<|vision_start|>, the image's rows, <|vision_end|>), the runner giving
every row its M-RoPE position (time / height / width, the text after the image from its start + max(rows,
columns)), and the per-position logits of the prompt against llama.cpp's, whole and with a token budget that
runs the image in a step of its own. A runner that gave the rows one-axis positions misses by far (see
tests/models/vision/test_qwen_prompt.py::test_one_axis_positions_do_not_match)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.engine.llm_engine import LLMEngine
from hitenter.sampling_params import SamplingParams
from hitenter.testing.tiny_qwen_vision import write_tiny_qwen3vl_mmproj, write_tiny_qwen25vl_mmproj, write_tiny_qwen_vl_text

GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "vision"
PROMPT = "Look at this: <__media__> It shows a small cat on a red mat, and the sky is blue today."
FAMILIES = {"qwen25vl": ("qwen2vl", write_tiny_qwen25vl_mmproj), "qwen3vl": ("qwen3vl", write_tiny_qwen3vl_mmproj)}


@pytest.mark.slow
@pytest.mark.parametrize("budget", [2048, 40])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_qwen_vl_prompt_through_the_engine(tmp_path: Path, name: str, budget: int) -> None:
    arch, writer = FAMILIES[name]
    with np.load(GOLDENS / f"{name}.npz") as z:
        golden = {k: z[k] for k in z.files}
    write_tiny_qwen_vl_text(tmp_path / "model.gguf", arch, seed=0)
    writer(tmp_path / "mmproj-tiny.gguf", seed=0)
    eng = LLMEngine(str(tmp_path / "model.gguf"), dtype="float32", max_num_batched_tokens=budget)
    assert eng.vision is not None
    ip = eng.image_prompt(PROMPT, [golden[f"image{int(golden['prompt_image'])}"]], add_bos=False)
    layout = np.array(ip.ids)
    for run in ip.runs:
        layout[run.start:run.end] = -1
    tokens, ref = golden["prompt_tokens"], golden["prompt_logits"]
    assert np.array_equal(layout, tokens)
    rows: list[torch.Tensor] = []
    model = eng.runner.model
    forward = model.forward

    def capture(ids, pos, meta, kv, **kw):  # noqa: ANN001, ANN202
        assert pos.ndim == 2 and pos.shape[1] == 4          # M-RoPE positions from the runner
        h = forward(ids, pos, meta, kv, **kw)
        rows.extend(h.clone())                            # one request: its rows arrive in order
        return h

    model.forward = capture
    rid = eng.add_request(None, ip, SamplingParams(max_tokens=2, temperature=0.0))
    while not any(o.request_id == rid and o.finished for o in eng.step()):
        pass
    ours = model.compute_logits(torch.stack(rows[:len(tokens)])).double().numpy()[tokens >= 0]
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    assert len(ref) >= 40 and agree >= len(ref) - len(ref) // 40, f"{agree}/{len(ref)}"
    assert np.abs(ours - ref).max() <= 5e-3 * np.abs(ref).max()
