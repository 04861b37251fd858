"""Llama / Qwen2 model: HF parity (tiny, live), KV-cache correctness, batch invariance, real-model goldens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from hitenter.models.decoder import CausalLM as LlamaModel
from hitenter.models.layers import pad_rows
from hitenter.models.linear import Linear, packed_rows_invariant
from hitenter.models.loader import load_model
from hitenter.paths import hitenter_home
from hitenter.testing.model_runs import Runner, greedy_batch
from hitenter.testing.paths import GOLDENS

# ---------------------------------------------------------------- tiny models


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request: pytest.FixtureRequest) -> tuple[LlamaModel, Path]:
    path = request.getfixturevalue(f"tiny_{request.param}_path")
    return load_model(path, dtype=torch.float32)[0], path   # HF parity: the dequantized fp32 reference


@pytest.mark.slow
def test_tiny_matches_hf_transformers(tiny: tuple[LlamaModel, Path]) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    model, path = tiny
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    ids = [5, 70, 100, 33, 200, 260, 4, 9, 11, 12, 13, 290, 1, 2, 7, 8, 99]
    ours = Runner(model, 1, 64).step({0: ids})[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert ours.std() > 0.3  # not degenerate
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_kv_cache_decode_matches_full_recompute(tiny: tuple[LlamaModel, Path]) -> None:
    model, _ = tiny
    ids = torch.randint(3, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    full = Runner(model, 1, 64).step({0: ids})[0]
    r = Runner(model, 1, 64)
    rows = [r.step({0: ids[:25]})[0]] + [r.step({0: [t]})[0] for t in ids[25:]]
    torch.testing.assert_close(torch.cat(rows), full, atol=1e-5, rtol=1e-5)


def test_batch_and_chunk_invariance_bitwise(tiny: tuple[LlamaModel, Path]) -> None:
    model, _ = tiny
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in (37, 1, 150, 9)]
    alone = [Runner(model, 4, 200).step({0: s})[0] for s in seqs]
    batched = Runner(model, 4, 200).step(dict(enumerate(seqs)))
    for i, _s in enumerate(seqs):
        assert torch.equal(alone[i], batched[i]), f"sequence {i} differs when batched"
    # chunked prefill of seq 2 (150 tokens) in 3 chunks, with others joining mid-way, then decode
    r = Runner(model, 4, 200)
    parts = [r.step({2: seqs[2][:20]})[2], r.step({0: seqs[0], 2: seqs[2][20:133]})[2]]
    parts.append(r.step({1: seqs[1], 2: seqs[2][133:], 3: seqs[3]})[2])
    assert torch.equal(torch.cat(parts), alone[2])


SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (1152, 896), (896, 896), (9728, 896),
          (896, 4864)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_linear_batch_invariance(shape: tuple[int, int], dtype: torch.dtype) -> None:
    """A row's output bits must not depend on how many rows share the (row-padded) GEMM: the model's
    Linear (packed for oneDNN where its load-time probe allows, else F.linear)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=g) * 0.05
    x = torch.randn(200, shape[1], generator=g).to(dtype)
    lin = Linear(w, None, dtype)
    ref = lin(pad_rows(x[3:4]))[0]
    for m in (4, 5, 8, 11, 16, 33, 64, 129, 200):
        out = lin(pad_rows(x[:m]))[3]
        assert torch.equal(out, ref), f"row differs at M={m}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_linear_matches_f_linear(dtype: torch.dtype) -> None:
    """The packed weight computes the same product: bitwise F.linear in bf16 (same oneDNN kernel),
    fp32 to float rounding (oneDNN's GEMM rather than MKL's); the bias is added."""
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(300, 576, generator=g) * 0.05, torch.randn(300, generator=g)
    x = torch.randn(24, 576, generator=g).to(dtype)
    lin = Linear(w, b, dtype)
    if not packed_rows_invariant(dtype):
        pytest.skip(f"no row-invariant oneDNN packed GEMM for {dtype} in this torch build")
    assert lin.packed is not None and lin.weight is None
    ref = F.linear(x, w.to(dtype), b.to(dtype))
    if dtype == torch.bfloat16:
        assert torch.equal(lin(x), ref)
    else:
        torch.testing.assert_close(lin(x), ref, rtol=1e-5, atol=1e-5)
    assert lin(x[:, :].t().contiguous().t()).shape == (24, 300)   # a non-contiguous input is accepted


# ---------------------------------------------------------------- real models (goldens from HF transformers)


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path, fp32_model) -> LlamaModel:  # type: ignore[no-untyped-def]
    return fp32_model(smollm2_path)   # the goldens are HF fp32 on the dequantized GGUF


@pytest.mark.slow
def test_smollm2_logits_match_goldens(smollm2: LlamaModel) -> None:
    gold = json.loads((GOLDENS / "model_smollm2_logits.json").read_text())
    worst = 0.0
    for case in gold["cases"]:
        logits = Runner(smollm2, 1, len(case["ids"])).step({0: case["ids"]})[0]
        assert logits.argmax(-1).tolist() == case["argmax"], case["text"]
        diff = (logits[-1, case["last_top_ids"]] - torch.tensor(case["last_top_values"])).abs().max().item()
        worst = max(worst, diff)
    print(f"SmolLM2 max |logit - golden| = {worst:.2e}")
    assert worst < 1e-2


def _check_greedy(model: LlamaModel, golden_file: str) -> None:
    gold = json.loads((GOLDENS / golden_file).read_text())
    cases = gold["cases"]
    outs = greedy_batch(model, [c["prompt_ids"] for c in cases], gold["new_tokens"])
    matched = sum(o == c["greedy_ids"] for o, c in zip(outs, cases, strict=True))
    print(f"{golden_file}: {matched}/{len(cases)} greedy continuations identical")
    for o, c in zip(outs, cases, strict=True):
        assert o == c["greedy_ids"], f"{c['kind']} prompt {c['text']!r} diverged"


@pytest.mark.slow
def test_smollm2_greedy_matches_goldens(smollm2: LlamaModel) -> None:
    _check_greedy(smollm2, "model_smollm2_greedy.json")


@pytest.mark.slow
def test_qwen2_greedy_matches_goldens(fp32_model) -> None:  # type: ignore[no-untyped-def]
    path = hitenter_home() / "models" / "qwen2.5-coder-0.5b-instruct.gguf"
    if not path.exists():
        pytest.skip(f"{path} is not cached (see scripts/make_model_goldens.py)")
    _check_greedy(fp32_model(path), "model_qwen2_greedy.json")
