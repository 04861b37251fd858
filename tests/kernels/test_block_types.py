"""The GGUF block types Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4: native kernels against the torch reference
(gguf-py's dequantizer, then an fp64 matmul), and tiny GGUF models in each type that load and generate.

Tolerance, the error model of tests/kernels/test_qmatmul.py: the kernels take the weights exactly (integer dots
per block, one fp32 scale product per block) and round the activations to int8, d_x = amax / 127 per
activation block, as llama.cpp does (Q8_0-style 32-blocks for IQ4_NL / MXFP4, Q8_K-style 256-blocks for
Q2_K / Q3_K / IQ4_XS). Each x_k moves by at most d_x / 2, so per output
    |y - y_exact| <= sum_k |w_k| d_x(k) / 2  +  1e-5 sum_k |w_k x_k|  +  1e-6,
the second term the fp32 scale products and block sums against the fp64 reference. Activations that are
exact multiples of d_x (`exact_activations`) make the first term zero: there the kernel must agree to the
fp32 slop alone, which catches a wrong scale, offset, codebook entry or bit position. Rows of an M-row call
are bitwise the same row alone (the row path and the packed GEMM give the same bits), on the default
build and the forced AVX2 and plain-C builds.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hitenter import LLM, SamplingParams
from hitenter.kernels import BLOCK_TYPES, BlockWeight, qmatmul
from hitenter.kernels.native import QMATMUL
from hitenter.models.block_linear import BlockLinear
from hitenter.models.gguf import SUPPORTED_TENSOR_TYPES
from hitenter.models.loader import load_model
from hitenter.testing.activations import exact_activations
from hitenter.testing.isa import forced_isa_params
from hitenter.testing.perplexity import _Seq
from hitenter.testing.tiny_model import random_kquant, write_tiny_gguf

qm = importlib.import_module("hitenter.kernels.qmatmul")
Q = gguf.GGMLQuantizationType
TYPES = [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4]
MS = [1, 3, 8, 17]
# (N, K) per type: 32-wide types with K = 5 and 18 blocks (not multiples of the 4 partial sums), 256-wide
# with 2 and 3 blocks; N not a multiple of the 8/16-row packed groups
SHAPES = {32: [(40, 160), (37, 576)], 256: [(40, 512), (37, 768)]}


def block_elems(qtype: Q) -> int:
    return gguf.GGML_QUANT_SIZES[qtype][0]


def weight(qtype: Q, n: int, k: int, seed: int = 0) -> BlockWeight:
    """MXFP4: gguf-py's own quantization of normal weights; the others: random valid blocks (random_kquant)."""
    rng = np.random.default_rng(seed)
    if qtype == Q.MXFP4:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, qtype)
    else:
        raw = random_kquant(qtype, n, k, rng)
    return BlockWeight(torch.from_numpy(np.ascontiguousarray(raw).reshape(n, -1)), int(qtype), (n, k))


def check_close(x: torch.Tensor, w: BlockWeight, wd: torch.Tensor, y: torch.Tensor, exact_acts: bool = False) -> None:
    """y within the module doc's bound of the fp64 product of x and wd, the weight dequantized (fp64)."""
    xd = x.double()
    ref = xd @ wd.t()
    blk = block_elems(Q(w.qtype))
    half_step = (xd.reshape(x.shape[0], -1, blk).abs().amax(-1) / 127).repeat_interleave(blk, dim=1) / 2
    bound = 1e-5 * (xd.abs() @ wd.abs().t()) + 1e-6
    if not exact_acts:
        bound = bound + half_step @ wd.abs().t()
    worst = ((y.double() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"{w.type_name} {w.shape} M={x.shape[0]}: error reaches {worst:.3g}x the bound"


@pytest.fixture
def one_thread() -> Iterator[None]:
    """These products are tiny: on a shared, oversubscribed machine OpenMP's barriers would take 50x their
    time (the thread count changes no bits: test_thread_count_invariance)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def check_type(qtype: Q, ms: list[int] = MS) -> None:
    """Every shape of the type, every M, random and exact activations; rows bitwise as computed alone."""
    for i, (n, k) in enumerate(SHAPES[block_elems(qtype)]):
        w = weight(qtype, n, k, seed=10 * int(qtype) + i)
        wd = w.dequantize().double()
        for m in ms:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            y = qmatmul(x, w)
            check_close(x, w, wd, y)
            xe = exact_activations(m, k, seed=m)
            check_close(xe, w, wd, qmatmul(xe, w), exact_acts=True)
            for r in {0, m - 1}:
                assert torch.equal(y[r:r + 1], qmatmul(x[r:r + 1], w)), f"{w.type_name} M={m} row {r}"


def test_types_are_registered() -> None:
    for t in TYPES:
        assert int(t) in BLOCK_TYPES and t in SUPPORTED_TENSOR_TYPES
        if qm.native_available():
            assert int(t) in QMATMUL().supported, f"{t.name}: no native kernel"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_native_matches_reference(qtype: Q, one_thread: None) -> None:
    assert qm.native_available()
    check_type(qtype)


@pytest.mark.parametrize("isa", forced_isa_params(["avx2", "generic"]))   # avx2: slow where it is the default build
def test_forced_isa_variants_match_reference(isa: str, reload_kernels: pytest.MonkeyPatch, one_thread: None) -> None:
    reload_kernels.setenv("HITENTER_QMATMUL_ISA", isa)
    if isa == "avx2" and not torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        pytest.skip("no AVX2 on this CPU")
    assert qm.native_isa() == isa
    for qtype in TYPES:
        check_type(qtype, [1, 17])


def test_thread_count_invariance() -> None:
    """Any thread count gives the same bits, on the row path (M = 1) and the packed GEMM (M = 17)."""
    threads = torch.get_num_threads()
    try:
        for qtype in TYPES:
            w = weight(qtype, 300, 512, seed=3)
            x = torch.randn(17, 512, generator=torch.Generator().manual_seed(4))
            torch.set_num_threads(1)
            want = [qmatmul(x[:1], w), qmatmul(x, w)]
            torch.set_num_threads(3)
            assert torch.equal(qmatmul(x[:1], w), want[0]) and torch.equal(qmatmul(x, w), want[1]), qtype.name
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[Q, Path]:
    """A one-layer tiny llama per type (hidden 256, so the 256-wide types cover every projection)."""
    d = tmp_path_factory.mktemp("block_types")
    return {t: write_tiny_gguf(d / f"{t.name}.gguf", quant=t.name, hidden=256, ffn=512, layers=1, seed=int(t),
                               tied=False) for t in TYPES}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_tiny_gguf_loads_matches_dense_and_generates(qtype: Q, tiny_paths: dict[Q, Path], one_thread: None) -> None:
    """Every projection stays in `qtype` blocks; logits follow the dense fp32 model within
    tests/models/test_formats.py's tolerances (the int8 activation rounding); greedy generation runs."""
    path = tiny_paths[qtype]
    model, cfg = load_model(path)
    assert model.weight_format == "gguf"
    parts = [p for m in model.modules() if isinstance(m, BlockLinear) for p in m.parts]
    assert len(parts) >= 5 and all(p.qtype == int(qtype) for p in parts)
    ref, _ = load_model(path, dtype="float32")
    ids = torch.randint(3, cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        a, b = _Seq(model, len(ids)).step(ids), _Seq(ref, len(ids)).step(ids)
    diff = (a - b).abs()
    assert b.std() > 0.1
    assert float(diff.mean()) <= 0.05 * float(b.std()) and float(diff.max()) <= 0.10 * float(b.abs().max())
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9
    llm = LLM(str(path), kv_cache_memory=1 << 22, max_model_len=128, block_size=16, num_threads=1)
    out = llm.generate(["Hello world"], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.token_ids) == 6
