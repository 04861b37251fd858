"""Native GGUF-block matmul kernels (hitenter/kernels/csrc) against the torch reference.

Error model. The kernel computes sum_k w_k * xq_k exactly in integers per block and scales in fp32,
where xq_k = d_x * round(x_k / d_x), d_x = amax(|x| over the activation block) / 127 (blocks of 32 for
the legacy types, 256 for the K types). Rounding moves each x_k by at most d_x / 2, so per output
    |y - y_exact| <= sum_k |w_k| * d_x(k) / 2  +  slop,
slop = 1e-5 * sum_k |w_k x_k| (fp32 scale products and a few hundred fp32 adds; the exact reference is
fp64). Activations that are already exactly d_x * integers make the first term zero: there the
kernel must agree to the slop alone, which catches any wrong scale, offset or nibble.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
import pickle
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hitenter.kernels import BlockWeight, block_weight_from_gguf, qmatmul, reference_qmatmul
from hitenter.models.gguf import open_gguf
from hitenter.testing.activations import exact_activations
from hitenter.testing.isa import forced_isa_params

# the module (the package attribute `qmatmul` is the function)
qm_mod = importlib.import_module("hitenter.kernels.qmatmul")

Q = gguf.GGMLQuantizationType
LEGACY = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
KTYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
ALL = LEGACY + KTYPES
MS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 64, 333]
MODELS = Path.home() / ".cache" / "hitenter" / "models"
# byte offsets of the fp16 scale/min fields in each block (ggml-common.h)
F16_FIELDS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
              Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_weight(qtype: Q, n: int, k: int, seed: int = 0) -> BlockWeight:
    """Real quantization where gguf implements it; else random valid blocks (random bytes, sane fp16 scales)."""
    rng = np.random.default_rng(seed)
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in LEGACY:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    else:
        raw = rng.integers(0, 256, size=(n, k // elems, nbytes), dtype=np.uint8)
        for pos in F16_FIELDS[qtype]:
            f16 = rng.uniform(0.001, 0.01, size=(n, k // elems)).astype(np.float16)
            raw[:, :, pos:pos + 2] = f16.view(np.uint8).reshape(n, k // elems, 2)
    return BlockWeight(torch.from_numpy(np.ascontiguousarray(raw).reshape(n, -1)), int(qtype), (n, k))


def act_block(qtype: int) -> int:
    return 32 if qtype in LEGACY else 256


def check_close(x: torch.Tensor, w: BlockWeight, y: torch.Tensor, exact_acts: bool = False) -> None:
    """y within the derived bound of the fp64 product of x and the dequantized weight."""
    wd = w.dequantize().double()
    xd = x.double()
    ref = xd @ wd.t()
    blk = act_block(w.qtype)
    dx = xd.reshape(x.shape[0], -1, blk).abs().amax(-1) / 127            # [M, K/blk]
    half_step = dx.repeat_interleave(blk, dim=1) / 2                       # [M, K]
    bound = 1e-5 * (xd.abs() @ wd.abs().t()) + 1e-6
    if not exact_acts:
        bound = bound + half_step @ wd.abs().t()
    err = (y.double() - ref).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{w.type_name}: error reaches {worst:.3g}x the bound"


def shape_for(qtype: Q) -> tuple[int, int]:
    return (40, 512) if qtype in KTYPES else (40, 160)    # legacy K = 5 blocks: not a multiple of 256


def run_against_reference(qtype: Q, ms: list[int]) -> None:
    n, k = shape_for(qtype)
    w = random_weight(qtype, n, k, seed=int(qtype))
    for m in ms:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        check_close(x, w, qmatmul(x, w))
        xe = exact_activations(m, k, seed=m)
        check_close(xe, w, qmatmul(xe, w), exact_acts=True)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_native_matches_reference(qtype: Q) -> None:
    assert qm_mod.native_available()
    run_against_reference(qtype, MS)


@pytest.mark.parametrize("isa", forced_isa_params(["avx2", "generic"]))   # avx2: slow where it is the default build
def test_forced_isa_variants_match_reference(isa: str, reload_kernels: pytest.MonkeyPatch) -> None:
    reload_kernels.setenv("HITENTER_QMATMUL_ISA", isa)
    assert qm_mod.native_isa() == isa
    for qtype in ALL:
        run_against_reference(qtype, [1, 5, 9, 70])
        n, k = shape_for(qtype)
        w = random_weight(qtype, n, k, seed=2)
        x = torch.randn(20, k, generator=torch.Generator().manual_seed(4))
        assert torch.equal(qmatmul(x, w)[17:18], qmatmul(x[17:18], w)), f"{isa} {w.type_name}: batch variant"


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_batch_invariance(qtype: Q) -> None:
    """Row m of an M-row call is bitwise the row alone, across the 8-row runs and the 64-row tiles."""
    n, k = shape_for(qtype)
    w = random_weight(qtype, n, k, seed=1)
    x = torch.randn(80, k, generator=torch.Generator().manual_seed(3))
    alone = torch.cat([qmatmul(x[i:i + 1], w) for i in range(80)])
    for m in (2, 3, 7, 8, 9, 13, 64, 65, 80):
        assert torch.equal(qmatmul(x[:m], w), alone[:m]), f"{w.type_name} M={m}"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(qmatmul(x, w), alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K], ids=lambda t: t.name)
def test_thread_count_invariance(qtype: Q) -> None:
    """Threads start on ranges of their own and steal the rest: any thread count (more threads than
    chunks too) gives the same bits, on the row path (M = 1, 5) and the packed GEMM (M = 16)."""
    n, k = 1000, 512   # not a multiple of the chunk sizes
    w = random_weight(qtype, n, k, seed=4)
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = {m: qmatmul(x[:m], w) for m in (1, 5, 16)}
        for t in (2, 3, 7, 40):
            torch.set_num_threads(t)
            for m, want in ref.items():
                assert torch.equal(qmatmul(x[:m], w), want), f"{w.type_name} M={m} threads={t}"
    finally:
        torch.set_num_threads(threads)


REAL = [("smollm2-135m-instruct", ["Q4_1", "Q8_0"]), ("qwen2.5-coder-0.5b-instruct", ["Q5_0", "Q8_0", "Q6_K"]),
        ("qwen2.5-coder-1.5b-instruct", ["Q4_K", "Q6_K"])]


@pytest.mark.slow    # real files: the full suite's
@pytest.mark.parametrize("model,types", REAL, ids=[m for m, _ in REAL])
def test_real_gguf_tensors(model: str, types: list[str]) -> None:
    path = MODELS / f"{model}.gguf"
    if not path.exists():
        pytest.skip(f"{path} not cached")
    # gguf-py's reader with its header arrays read in one go (the stock one spends ~20 s on Qwen's
    # 151k-entry vocabulary); the tensors are gguf-py's own ReaderTensor views of the file
    reader = open_gguf(path)
    seen: set[str] = set()
    for t in reader.tensors:
        name = t.tensor_type.name
        if name in types and name not in seen:
            seen.add(name)
            w = block_weight_from_gguf(t).narrow(0, 0, 48)      # a row slice keeps the test fast
            x = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(0))
            check_close(x, w, qmatmul(x, w))
            xe = exact_activations(3, w.shape[1], seed=1)
            check_close(xe, w, qmatmul(xe, w), exact_acts=True)
    assert seen == set(types)


def test_out_and_strided_input() -> None:
    w = random_weight(Q.Q4_K, 16, 256)
    big = torch.randn(4, 300)
    x = big[:, :256]                                   # rows with a stride: no copy needed
    out = torch.full((4, 16), float("nan"))
    assert qmatmul(x, w, out=out) is out
    assert torch.equal(out, qmatmul(x.contiguous(), w))


def test_invalid_inputs_are_refused() -> None:
    w = random_weight(Q.Q8_0, 8, 64)
    with pytest.raises(ValueError, match="fp32"):
        qmatmul(torch.randn(2, 64, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="K=32"):
        qmatmul(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match="2-D"):
        qmatmul(torch.randn(64), w)
    with pytest.raises(ValueError, match="out must be"):
        qmatmul(torch.randn(2, 64), w, out=torch.empty(3, 8))


def test_fallback_when_build_fails(reload_kernels: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    reload_kernels.setenv("CC", os.path.join(os.sep, "nonexistent", "cc"))
    w = random_weight(Q.Q4_0, 8, 64)
    x = torch.randn(3, 64)
    with caplog.at_level(logging.WARNING, logger="hitenter.kernels.qmatmul"):
        assert not qm_mod.native_available()
        y1, y2 = qmatmul(x, w), qmatmul(x, w)
    assert torch.equal(y1, reference_qmatmul(x, w)) and torch.equal(y1, y2)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "reference" in warnings[0].getMessage()


def test_disabled_by_env(reload_kernels: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    reload_kernels.setenv("HITENTER_QMATMUL", "0")
    with caplog.at_level(logging.WARNING):
        assert not qm_mod.native_available()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_cached_descriptor_follows_the_weight() -> None:
    """qmatmul caches a validated descriptor on the BlockWeight; changing the weight's data rebuilds it."""
    w = random_weight(Q.Q4_1, 24, 96, seed=5)
    other = random_weight(Q.Q4_1, 24, 96, seed=6)
    x = torch.randn(3, 96)
    y1 = qmatmul(x, w)
    assert torch.equal(qmatmul(x, w), y1)
    w.data = other.data
    assert torch.equal(qmatmul(x, w), qmatmul(x, other))
    assert w == BlockWeight(other.data, other.qtype, other.shape)    # the cache is not a dataclass field
    row = torch.randn(96, 1).t()                                     # [1, K] with stride (1, 1)
    assert torch.equal(qmatmul(row, w), qmatmul(row.contiguous(), w))
    clone = pickle.loads(pickle.dumps(w))                            # e.g. sent to a worker process
    assert torch.equal(qmatmul(x, clone), qmatmul(x, other))
    assert torch.equal(qmatmul(x, copy.deepcopy(w)), qmatmul(x, other))


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_packed_gemm_matches_row_path_on_ragged_shapes(qtype: Q) -> None:
    """M = 21 takes the packed GEMM: bitwise the row path's result (M = 1), with N not a multiple of the 8-row
    groups and (legacy) a block count not a multiple of the 4 partial sums."""
    k = 576 if qtype in LEGACY else 768                  # 18 legacy blocks (18 % 4 = 2), 3 K blocks
    w = random_weight(qtype, 37, k, seed=7)
    x = torch.randn(21, k, generator=torch.Generator().manual_seed(8))
    y = qmatmul(x, w)
    check_close(x, w, y)
    for i in (0, 8, 15, 16, 20):
        assert torch.equal(y[i:i + 1], qmatmul(x[i:i + 1], w)), f"{w.type_name} row {i}"


# fp16 fields of the block types whose codes test_largest_codes_do_not_overflow saturates, beyond F16_FIELDS
_F16_MORE = {Q.Q2_K: [80, 82], Q.Q3_K: [108]}


@pytest.mark.parametrize("qtype", ALL + [Q.Q2_K, Q.Q3_K], ids=lambda t: t.name)
def test_largest_codes_do_not_overflow(qtype: Q) -> None:
    """Every code byte 0xFF (every weight at its largest code: Q6_K 63, Q5_* 31, Q4_* 15) against activations
    all at +amax (quantized 127), so every product is at its maximum: the AVX2 kernels add maddubs pairs in
    int16 over several dwords before widening (csrc/qmatmul/qm_pack_avx2.h), exact only while the bound holds. A wrap
    here is off by 65536 units of d * d_x, far outside the bound; row path (M = 1) and packed GEMM (M = 16)."""
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    n, k = 16, 256
    raw = np.full((n, k // elems, nbytes), 0xFF, dtype=np.uint8)
    for pos in {**F16_FIELDS, **_F16_MORE}[qtype]:
        raw[..., pos:pos + 2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    w = BlockWeight(torch.from_numpy(raw.reshape(n, -1)), int(qtype), (n, k))
    for m in (1, 16):
        for sign in (1.0, -1.0):
            x = torch.full((m, k), sign)
            check_close(x, w, qmatmul(x, w), exact_acts=True)


@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
def test_long_rows_and_every_run_length(qtype: Q) -> None:
    """K = 4608 (18 K blocks, longer than the other tests' rows) at every M from 2 to 20: the row path's instance
    for each run length (Q4_K/Q5_K/Q6_K to 8 rows, balanced runs beyond; from 3 rows their float steps lane-wise
    across the rows), the packed GEMM's balanced runs (7 + 6 at M = 13; on AVX2 without VNNI the K types pack
    from M = 17). Every row bitwise the row alone, and close to the reference."""
    w = random_weight(qtype, 70, 4608, seed=9)
    x = torch.randn(20, 4608, generator=torch.Generator().manual_seed(10))
    alone = torch.cat([qmatmul(x[i:i + 1], w) for i in range(20)])
    check_close(x, w, alone)
    for m in range(2, 21):
        assert torch.equal(qmatmul(x[:m], w), alone[:m]), f"{w.type_name} M={m}"
