"""A Gemma 4 image through the engine (tiny random gemma4 text model + tiny gemma4v mmproj found beside it,
tests/goldens/vision/gemma4v.npz from scripts/make_dynamic_vision_goldens.py): the prompt laid out as mtmd lays
it out (`<|image>`, the image's rows, `<image|>`), the image's rows attended bidirectionally on the
sliding-window layers, and the per-position logits of the prompt (text and image rows) against llama.cpp's,
whole and with a token budget that runs the image alone. With the layers in Q8_0 blocks (the fused C layers
run the generation rows), an image prompt beside a generating request keeps the bits it has alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.engine.llm_engine import LLMEngine
from hitenter.sampling_params import SamplingParams
from hitenter.testing.image_prompt_runs import image_prompt_logits
from hitenter.testing.tiny_families import GEMMA4, write_tiny_family
from hitenter.testing.tiny_gemma4v import write_tiny_gemma4v_mmproj

GOLDEN = Path(__file__).resolve().parents[1] / "goldens" / "vision" / "gemma4v.npz"
PROMPT = "Look at this: <__media__> It shows a small cat on a red mat, and the sky is blue today."


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


def _model(folder: Path, quant: str | None = None) -> Path:
    write_tiny_gemma4v_mmproj(folder / "mmproj-tiny.gguf", seed=0)
    return write_tiny_family(folder / "model.gguf", "gemma4", seed=0, quant=quant)


class RowCapture:
    """Every step's sequences as the model computes them: per step, (positions, final hidden rows) of each
    sequence (split by the step's query_start_loc)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.model = engine.runner.model
        self.steps: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        forward = self.model.forward

        def capture(ids, pos, meta, kv, **kw):  # noqa: ANN001, ANN202
            h = forward(ids, pos, meta, kv, **kw)
            qsl = meta.query_start_loc
            self.steps.append([(pos[a:b].clone(), h[a:b].clone()) for a, b in zip(qsl[:-1], qsl[1:], strict=True)])
            return h
        self.model.forward = capture

    def prompt_rows(self, n: int) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
        """The rows of the prompt at positions 0..n-1 (the request whose first step starts at 0, followed step
        by step), and its steps: (first position, rows, sequences in the step)."""
        rows, shared, done = [], [], 0
        for step in self.steps:
            for pos, h in step:
                if done < n and len(pos) and int(pos[0]) == done:
                    k = min(len(pos), n - done)
                    rows.append(h[:k])
                    shared.append((done, k, len(step)))
                    done += k
        assert done == n, f"the prompt's rows were computed up to {done} of {n}"
        return torch.cat(rows), shared


def _finish(eng: LLMEngine, rid: str) -> None:
    while not any(o.request_id == rid and o.finished for o in eng.step()):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("budget", [2048, 16])
def test_gemma4_prompt_through_the_engine(tmp_path: Path, golden: dict[str, np.ndarray], budget: int) -> None:
    eng = LLMEngine(str(_model(tmp_path)), dtype="float32", max_num_batched_tokens=budget)
    assert eng.vision is not None and eng.vision.encoder.bidirectional
    ip = eng.image_prompt(PROMPT, [golden[f"image{int(golden['prompt_image'])}"]], add_bos=False)
    layout = np.array(ip.ids)
    for run in ip.runs:
        layout[run.start:run.end] = -1
    tokens = golden["prompt_tokens"]
    assert np.array_equal(layout, tokens) and ip.runs[0].bidirectional
    cap = RowCapture(eng)
    _finish(eng, eng.add_request(None, ip, SamplingParams(max_tokens=2, temperature=0.0)))
    rows, _ = cap.prompt_rows(len(tokens))
    ours = cap.model.compute_logits(rows).double().numpy()
    for sel, ref in ((tokens >= 0, golden["prompt_logits"]), (tokens < 0, golden["prompt_image_logits"])):
        o = ours[sel]
        agree = int((o.argmax(-1) == ref.argmax(-1)).sum())
        assert len(ref) >= 40 and agree >= len(ref) - len(ref) // 40, f"{agree}/{len(ref)}"
        assert np.abs(o - ref).max() <= 5e-3 * np.abs(ref).max()


@pytest.mark.slow
def test_image_beside_a_generating_request_keeps_its_bits(tmp_path: Path, golden: dict[str, np.ndarray],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Q8_0 layers (per-layer inputs of 32: a Q8_0 block, so no dense GEMM is left in a layer): the other
    request's generation rows take the fused C layers in the image's step, the image's rows the torch layers
    (layer_routing.gemm_only) with their bidirectional range: the same bits alone and beside, and the image rows'
    logits those of the model run directly with the image's range."""
    monkeypatch.setitem(GEMMA4, "per_layer", 32)
    eng = LLMEngine(str(_model(tmp_path, "Q8_0")), enable_prefix_caching=False,   # the GGUF blocks kept
                    kv_cache_dtype="float32")   # as the direct run below
    assert not eng.runner.model.layers_dense   # the C layers run the generation rows
    ip = eng.image_prompt(PROMPT, [golden["image1"]], add_bos=False)
    greedy = SamplingParams(max_tokens=3, temperature=0.0)
    cap = RowCapture(eng)
    _finish(eng, eng.add_request(None, ip, greedy))
    ref, steps = cap.prompt_rows(len(ip))
    assert steps == [(0, len(ip), 1)]
    cap.steps.clear()
    other = eng.add_request(None, "Tell me a long story about the sea " * 3,
                            SamplingParams(max_tokens=40, ignore_eos=True))
    for _ in range(3):
        eng.step()   # its prompt, then generation rows
    cap.steps.clear()
    _finish(eng, eng.add_request(None, ip, greedy))
    _finish(eng, other)
    beside, steps = cap.prompt_rows(len(ip))
    run = ip.runs[0]
    (image_step,) = [k for first, rows, k in steps if first <= run.start < first + rows]
    assert image_step == 2, f"the image's step did not hold the generating request's row: {steps}"
    assert torch.equal(beside, ref)
    # and those bits are the image attended as llama.cpp does: the model run directly (every row on the torch
    # layers, the image's range bidirectional on the sliding-window layers) gives the image rows' logits
    layout = np.array(ip.ids)
    layout[run.start:run.end] = -1
    direct = image_prompt_logits(cap.model, layout, eng.vision.encoder.encode(run.pixels), bidirectional=True)
    ours = cap.model.compute_logits(ref[run.start:run.end])
    torch.testing.assert_close(ours, direct[run.start:run.end], rtol=0, atol=1e-4 * float(direct.abs().max()))
