"""Quantized weight formats (hitenter/quant): layout conversion, kernels against fp32 references,
batch invariance, and perplexity / greedy quality on SmolLM2 against the fp32-dequantized model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hitenter.models.loader import load_model
from hitenter.quant import (
    Int4Linear,
    Int4Weight,
    Int8Linear,
    int4_from_float,
    int4_from_gguf_blocks,
    int8_from_float,
    weight_bytes,
)
from hitenter.testing.perplexity import PROMPTS, english_text, greedy, perplexity

# one 512-token window of the bundled text (was 1,024: bf16's matmuls alone took ~49 s CPU there, 23 s here).
# Quantized / fp32 perplexity - 1 at 512 vs 1,024 tokens: int8 +0.54% / +0.33%, int4 +0.38% / +0.45%,
# bf16 +0.11% / +0.21% (fp32 13.30 / 16.59); the bound is 2%. A damaged int8 model (noise of 0.5 / 1 / 2% of
# the output's std added to every down projection) measured +1.5 / +3.1 / +8.1% at 512, +0.6 / +1.4% at 1,024
PPL_TOKENS = 512


def _rand_int4(n: int, k: int, seed: int = 0) -> Int4Weight:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3
    zero = torch.randn(n, k // 32, generator=g) * 0.01
    return Int4Weight(q, scale, zero)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_int4_from_gguf_blocks_is_exact(qtype: str) -> None:
    w = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    t = gguf.GGMLQuantizationType[qtype]
    blocks = gguf.quants.quantize(w, t)
    ref = torch.from_numpy(gguf.quants.dequantize(blocks, t).reshape(48, 96).copy())
    iw = int4_from_gguf_blocks(blocks, t, 96)
    torch.testing.assert_close(iw.dequantize(), ref, rtol=0, atol=1e-6)


def test_torch_int4_convention_and_fp32_exactness() -> None:
    """w = (q - 8) * scale + zero: with fp32 compute the kernel matches x @ dequantize().T to fp rounding."""
    w = _rand_int4(48, 96)   # N = 48 is not a multiple of 16: exercises the padded columns
    x = torch.randn(5, 96)
    lin = Int4Linear(w, compute_dtype=torch.float32)
    torch.testing.assert_close(lin(x), x @ w.dequantize().T, rtol=1e-5, atol=1e-5)


def test_int8_linear_fp32_exact_and_bf16_close() -> None:
    w = torch.randn(64, 96) * 0.05
    b = torch.randn(64)
    iw = int8_from_float(w)
    assert (iw.dequantize() - w).abs().max() <= iw.scale.float().max() * 0.5 + 1e-6
    x = torch.randn(7, 96)
    ref = x @ iw.dequantize().T + b
    torch.testing.assert_close(Int8Linear(iw, b, compute_dtype=torch.float32)(x), ref, rtol=1e-5, atol=1e-5)
    y = Int8Linear(iw, b)(x)   # bfloat16 compute (the fast kernel): bf16-level agreement
    assert y.dtype == torch.float32
    assert (y - ref).abs().max() < 0.02 * ref.abs().max()


def test_int4_linear_bf16_close_to_float_weights() -> None:
    w = torch.randn(96, 128) * 0.05
    iw = int4_from_float(w)
    assert (iw.dequantize() - w).abs().max() <= iw.scale.max() * 0.5 + 1e-6
    x = torch.randn(9, 128)
    ref = x @ iw.dequantize().T
    y = Int4Linear(iw)(x)
    assert (y - ref).abs().max() < 0.02 * ref.abs().max()


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernels_are_batch_invariant(kind: str, dtype: torch.dtype) -> None:
    """A row's output bits do not depend on the row count M (1..40) or its position in the batch."""
    k, n = 128, 80
    w = torch.randn(n, k) * 0.05
    lin = (Int8Linear(int8_from_float(w), compute_dtype=dtype) if kind == "int8"
           else Int4Linear(int4_from_float(w), compute_dtype=dtype))
    x = torch.randn(40, k)
    full = lin(x)
    for m in range(1, 41):
        assert torch.equal(lin(x[:m]), full[:m]), m
    assert torch.equal(lin(x.flip(0)).flip(0), full)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_tiny_model_quantized_matches_fp32(tiny_qwen2_path: Path, tiny_llama_path: Path, mode: str) -> None:
    """Tiny models: the quantized model's logits follow the fp32 model's; model bytes shrink."""
    for path in (tiny_llama_path, tiny_qwen2_path):
        ref, _ = load_model(path, dtype=torch.float32)
        qm, _ = load_model(path, quantization=mode)
        ids = list(range(3, 40))
        a, b = _logits(ref, ids), _logits(qm, ids)
        # fp32 random weights requantized: int8 tracks closely, 4-bit (16 levels per group) less so
        assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > (0.995 if mode == "int8" else 0.97)
        # the decoder layers shrink; the embedding / head keep their exact GGUF table (fp32 in these tiny models)
        assert weight_bytes(qm.layers) < 0.45 * weight_bytes(ref.layers)
        assert qm.weight_bytes() < ref.weight_bytes()


def test_tiny_model_int4_from_q4_1_gguf(tmp_path: Path) -> None:
    """Q4_1 projection blocks map exactly: with fp32 compute, Int4Linear == the fp32 linear to rounding."""
    from hitenter.testing.tiny_model import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "q41.gguf", arch="llama", quant="Q4_1")
    ref, _ = load_model(path, dtype=torch.float32)
    qm, _ = load_model(path, quantization="int4")
    for lr, lq in zip(ref.layers, qm.layers, strict=True):
        for name in ("qkv", "o_proj", "gate_up", "down"):
            fp, q4 = getattr(lr, name), getattr(lq, name)
            assert isinstance(q4, Int4Linear)
            exact = Int4Linear.__new__(Int4Linear)
            exact.__dict__.update(q4.__dict__)
            exact.compute_dtype = torch.float32
            exact._buffers = dict(q4._buffers)
            exact._buffers["scales_and_zeros"] = q4.scales_and_zeros.float()
            x = torch.randn(8, fp.in_features)
            assert (exact(x) - fp(x)).abs().max() < 1e-2 * fp(x).abs().max()


def test_quantized_with_tensor_parallel_raises(tiny_llama_path: Path) -> None:
    class FakeTP:
        rank, size = 0, 2

    with pytest.raises(ValueError, match="not supported yet"):
        load_model(tiny_llama_path, tp=FakeTP(), quantization="int8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quantization"):
        load_model(tiny_llama_path, quantization="int3")


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    from hitenter.testing.perplexity import _Seq

    with torch.inference_mode():
        return _Seq(model, len(ids)).step(ids)


# ---------------------------------------------------------------- SmolLM2 quality


@pytest.fixture(scope="module")
def smol_ids(smollm2_path: Path) -> list[int]:
    from hitenter.tokenizer.bpe import Tokenizer

    return Tokenizer.from_gguf(smollm2_path).encode(english_text())


@pytest.fixture(scope="module")
def smol_fp32(smollm2_path: Path, fp32_model) -> torch.nn.Module:  # type: ignore[no-untyped-def]
    return fp32_model(smollm2_path)


@pytest.fixture(scope="module")
def smol_quantized(smollm2_path: Path) -> Iterator[Callable[[str], torch.nn.Module]]:
    """``smol_quantized(mode)``: SmolLM2 in int8 / int4 / bf16, each loaded once for this module (read only)."""
    models: dict[str, torch.nn.Module] = {}

    def get(mode: str) -> torch.nn.Module:
        if mode not in models:
            models[mode] = (load_model(smollm2_path, dtype=torch.bfloat16) if mode == "bf16"
                            else load_model(smollm2_path, quantization=mode))[0]
        return models[mode]

    yield get
    models.clear()


@pytest.fixture(scope="module")
def smol_fp32_ppl(smol_fp32: torch.nn.Module, smol_ids: list[int]) -> float:
    return perplexity(smol_fp32, smol_ids, 512, PPL_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int4", "bf16"])
def test_smollm2_perplexity_within_2_percent(smol_quantized: Callable[[str], torch.nn.Module], smol_ids: list[int],
                                             smol_fp32_ppl: float, mode: str) -> None:
    ppl = perplexity(smol_quantized(mode), smol_ids, 512, PPL_TOKENS)
    assert 5 < smol_fp32_ppl < 60
    assert abs(ppl / smol_fp32_ppl - 1) < 0.02, (mode, ppl, smol_fp32_ppl)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_smollm2_next_token_in_fp32_top3(smollm2_path: Path, smol_fp32: torch.nn.Module,
                                         smol_quantized: Callable[[str], torch.nn.Module], mode: str) -> None:
    """The quantized model's greedy next token is one of the fp32 model's top 3 on every prompt.

    (Agreement over 24 greedy tokens: see test_smollm2_int4_greedy_agrees_with_fp32.)"""
    from hitenter.tokenizer.bpe import Tokenizer

    tok = Tokenizer.from_gguf(smollm2_path)
    ref, qm = smol_fp32, smol_quantized(mode)
    for p in PROMPTS:
        ids = tok.encode(p)
        top3 = _logits(ref, ids)[-1].topk(3).indices.tolist()
        assert int(_logits(qm, ids)[-1].argmax()) in top3, p
    assert greedy(qm, tok.encode(PROMPTS[0]), 2) == greedy(ref, tok.encode(PROMPTS[0]), 2)


@pytest.mark.slow
def test_smollm2_int4_greedy_agrees_with_fp32(smollm2_path: Path, smol_fp32: torch.nn.Module,
                                              smol_quantized: Callable[[str], torch.nn.Module]) -> None:
    """int4 (the GGUF's exact Q4_1 weights, bf16 activations, rescored head), fed the fp32 model's 24 greedy
    tokens after each prompt, predicts that model's next token at >= 95% of the positions (measured 97.9%;
    int8, requantized per row, 95.4%). Teacher-forced, so one near-tie does not decide a whole
    continuation: exact 24-token continuations measured 5-6 of 10, flipping with fp32 rounding alone.

    The ten prompts run as one batch in both models (a row's bits do not depend on its batch: the
    fp32 continuations equal the one-prompt-at-a-time ones), so the weights are read 24 times, not 240."""
    from hitenter.testing.model_runs import Runner, greedy_batch
    from hitenter.tokenizer.bpe import Tokenizer

    tok = Tokenizer.from_gguf(smollm2_path)
    ref, qm = smol_fp32, smol_quantized("int4")
    prompts = [tok.encode(p) for p in PROMPTS]
    with torch.inference_mode():
        conts = greedy_batch(ref, prompts, 24)
        rows = Runner(qm, len(prompts), max(map(len, prompts)) + 24).step(
            {i: p + c for i, (p, c) in enumerate(zip(prompts, conts, strict=True))})
    agree = total = 0
    for i, (ids, cont) in enumerate(zip(prompts, conts, strict=True)):
        pred = rows[i][len(ids) - 1:-1].argmax(-1).tolist()
        agree += sum(a == b for a, b in zip(pred, cont, strict=True))
        total += len(cont)
    assert agree >= 0.95 * total, f"{agree}/{total}"


def test_rescored_head_gives_exact_logits_to_its_top_k() -> None:
    """The top-k rows of each output row equal float64 dot products with the exact table; others stay coarse."""
    from hitenter.quant import ExactRows, Int4Linear, RescoredHead

    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (300, 64), generator=g, dtype=torch.int8)
    d = torch.rand(300, 2, generator=g) * 0.01
    exact = ExactRows(q, d)
    full = exact.rows(torch.arange(300), torch.float64)
    head = RescoredHead(Int4Linear(int4_from_float(full.float())), exact, k=8)
    x = torch.randn(5, 64, generator=g)
    out = head(x)
    ref = (x.double() @ full.t()).float()
    coarse = head.coarse(x).float()
    top = coarse.topk(8, dim=-1).indices
    assert torch.equal(out.gather(1, top), ref.gather(1, top))
    assert torch.equal(out.argmax(-1), ref.argmax(-1))
    rest = torch.ones_like(out, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(out[rest], coarse[rest])
    for m in range(1, 6):   # per row: batch invariant
        assert torch.equal(head(x[:m]), out[:m])
