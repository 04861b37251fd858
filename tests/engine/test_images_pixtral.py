"""A Pixtral image through the engine (tiny random mistral3 text model + tiny Pixtral mmproj found beside it,
tests/goldens/vision/pixtral.npz from scripts/make_dynamic_vision_goldens.py): the prompt laid out as mtmd lays
it out (the image's rows with their [IMG_BREAK] rows, then [IMG_END]), and the per-position logits of the
prompt against llama.cpp's, whole and with a token budget that runs the image alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.engine.llm_engine import LLMEngine
from hitenter.sampling_params import SamplingParams
from hitenter.testing.tiny_families import write_tiny_family
from hitenter.testing.tiny_pixtral import write_tiny_pixtral_mmproj

GOLDEN = Path(__file__).resolve().parents[1] / "goldens" / "vision" / "pixtral.npz"
PROMPT = "Look at this: <__media__> It shows a small cat on a red mat, and the sky is blue today."


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pixtral_engine")
    write_tiny_pixtral_mmproj(d / "mmproj-tiny.gguf", seed=0)
    return write_tiny_family(d / "model.gguf", "mistral3", seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [2048, 16])
def test_pixtral_prompt_through_the_engine(model_path: Path, golden: dict[str, np.ndarray], budget: int) -> None:
    eng = LLMEngine(str(model_path), dtype="float32", max_num_batched_tokens=budget)
    assert eng.vision is not None
    image = golden[f"image{int(golden['prompt_image'])}"]
    ip = eng.image_prompt(PROMPT, [image], add_bos=False)
    layout = np.array(ip.ids)
    for run in ip.runs:
        layout[run.start:run.end] = -1
    tokens, ref = golden["prompt_tokens"], golden["prompt_logits"]
    assert np.array_equal(layout, tokens)
    rows: dict[int, torch.Tensor] = {}
    model = eng.runner.model
    forward = model.forward

    def capture(ids, pos, meta, kv, **kw):  # noqa: ANN001, ANN202
        h = forward(ids, pos, meta, kv, **kw)
        for p, row in zip(pos.tolist(), h, strict=False):
            rows.setdefault(p, row.clone())
        return h

    model.forward = capture
    rid = eng.add_request(None, ip, SamplingParams(max_tokens=2, temperature=0.0))
    while not any(o.request_id == rid and o.finished for o in eng.step()):
        pass
    ours = model.compute_logits(torch.stack([rows[p] for p in range(len(tokens))])).double().numpy()[tokens >= 0]
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    assert len(ref) >= 40 and agree >= len(ref) - len(ref) // 40, f"{agree}/{len(ref)}"
    assert np.abs(ours - ref).max() <= 5e-3 * np.abs(ref).max()
