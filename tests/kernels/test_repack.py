"""Weights repacked at load (hitenter/kernels/csrc/qmatmul/qm_repack.h): lossless, and the same qmatmul bits as
the file's rows through every path (M from 1 to beyond the packed threshold, ragged N, any thread count,
the AVX2 build's 8-lane groups)."""

from __future__ import annotations

import importlib

import gguf
import numpy as np
import pytest
import torch

from hitenter.kernels import BlockWeight, qmatmul, reference_qmatmul
from hitenter.kernels.native import QMATMUL
from hitenter.models.block_linear import BlockEmbedding, BlockLinear
from hitenter.models.loader import load_model
from hitenter.testing.isa import default_build_is_avx2
from hitenter.testing.tiny_model import write_tiny_gguf

qm = importlib.import_module("hitenter.kernels.qmatmul")
Q = gguf.GGMLQuantizationType
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]


def weight(qtype: Q, n: int, k: int, seed: int = 0) -> BlockWeight:
    rng = np.random.default_rng(seed)
    raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    return BlockWeight(torch.from_numpy(np.ascontiguousarray(raw).reshape(n, -1)), int(qtype), (n, k))


def repacked(w: BlockWeight) -> BlockWeight:
    nbytes = qm.repacked_nbytes(w)
    if not nbytes:
        pytest.skip(f"{w.type_name} is not repacked by this build ({qm.native_isa()})")
    return qm.repack(w, torch.empty(nbytes, dtype=torch.uint8))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n,k", [(40, 160), (16, 32), (1, 96), (77, 576)])
def test_repacked_is_lossless_and_bitwise_equal(qtype: Q, n: int, k: int) -> None:
    w = weight(qtype, n, k, seed=n)
    r = repacked(w)
    assert r.lanes == QMATMUL().lanes and r.nbytes() == -(-n // r.lanes) * r.lanes * (k // 32) * (34 if qtype == Q.Q8_0 else 20)
    assert torch.equal(r.file_rows(), w.data)
    assert torch.equal(r.dequantize(), w.dequantize())
    assert torch.equal(r.dequantize(torch.tensor([0, n - 1])), w.dequantize(torch.tensor([0, n - 1])))
    rows = torch.tensor([n - 1, 0, n // 2, n // 2])
    assert torch.equal(r.file_rows(rows), w.data.index_select(0, rows))
    assert torch.equal(r.dequantize(rows), w.dequantize()[rows])     # the lookups' torch formulas: gguf's bits
    assert torch.equal(w.dequantize(rows), w.dequantize()[rows])
    for m in (1, 2, 3, 5, 8, 9, 16, 17, 33, 70):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        want = qmatmul(x, w)
        assert torch.equal(qmatmul(x, r), want), f"M={m}"
        assert torch.equal(qmatmul(x[m - 1:], r), want[m - 1:])     # a row alone: the same bits
    x = torch.randn(6, k)
    for threads in (1, 3):
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            assert torch.equal(qmatmul(x, r), qmatmul(x, w))
        finally:
            torch.set_num_threads(prev)


def test_repacked_weight_refuses_row_operations() -> None:
    r = repacked(weight(Q.Q4_1, 32, 64))
    with pytest.raises(NotImplementedError):
        r.narrow(0, 0, 16)
    with pytest.raises(NotImplementedError):
        r.index_rows(torch.tensor([1]))
    with pytest.raises(ValueError):
        BlockWeight(r.data[:-1], r.qtype, r.shape, r.lanes)      # the wrong size for its shape
    with pytest.raises(ValueError):
        qm.repack(weight(Q.Q4_1, 32, 64), torch.empty(7, dtype=torch.uint8))


def test_repacked_weight_under_another_build_takes_the_reference(reload_kernels: pytest.MonkeyPatch) -> None:
    w = weight(Q.Q4_1, 40, 160)
    r = repacked(w)
    x = torch.randn(5, 160)
    reload_kernels.setenv("HITENTER_QMATMUL_ISA", "generic")     # no repacking there: lanes differ
    QMATMUL.reset()
    assert qm.native_isa() == "generic" and not qm.repack_enabled()
    torch.testing.assert_close(qmatmul(x, r), reference_qmatmul(x, w), rtol=0, atol=0.05)


def test_avx2_build_repacks_eight_lanes(reload_kernels: pytest.MonkeyPatch) -> None:
    if not default_build_is_avx2():   # else the default build is this build: no second compile
        reload_kernels.setenv("HITENTER_QMATMUL_ISA", "avx2")
    if qm.native_isa() != "avx2":
        pytest.skip("no AVX2 build here")
    w = weight(Q.Q4_0, 37, 96)
    r = repacked(w)
    assert r.lanes == 8
    x = torch.randn(19, 96)
    assert torch.equal(qmatmul(x, r), qmatmul(x, w)) and torch.equal(r.file_rows(), w.data)
    # Q8_0: the stored w + 128 back to signed w, |w| . sign(x, w); every code, -128 included, and |x| at 127
    raw = weight(Q.Q8_0, 24, 64).data.clone()
    codes = torch.arange(256, dtype=torch.uint8).repeat(6).view(24, 64)
    raw.view(24, 2, 34)[:, :, 2:] = codes.view(24, 2, 32)
    w8 = BlockWeight(raw, int(Q.Q8_0), (24, 64))
    r8 = repacked(w8)
    x = torch.randn(19, 64)
    x[:, ::7] = 50.0   # the block maxima: their codes are exactly 127
    for m in (1, 8, 19):
        assert torch.equal(qmatmul(x[:m], r8), qmatmul(x[:m], w8)), f"M={m}"
    torch.testing.assert_close(qmatmul(x, r8), reference_qmatmul(x, w8), rtol=1e-2, atol=0.5)


@pytest.mark.parametrize("tied", [True, False])
def test_loader_repacks_matmul_weights_and_tied_tables(tmp_path, monkeypatch, tied: bool) -> None:   # type: ignore[no-untyped-def]
    path = write_tiny_gguf(tmp_path / "m.gguf", quant="Q8_0", tied=tied)
    model, _ = load_model(path)
    parts = [p for m in model.modules() if isinstance(m, BlockLinear) for p in m.parts]
    emb = next(m for m in model.modules() if isinstance(m, BlockEmbedding))
    table = emb.table.data.data_ptr()
    want = qm.repack_enabled() and qm.native_isa() in ("avx2", "avx512vnni")
    assert all(bool(p.lanes) == want for p in parts)
    # a tied table is the head's repacked bytes, its lookups read from there (the same rows as the file's)
    assert emb.table.lanes == (parts[0].lanes if tied and want else 0)
    assert any(p.data.data_ptr() == table for p in parts) == tied
    monkeypatch.setenv("HITENTER_REPACK", "0")
    plain, _ = load_model(path)
    ref = next(m for m in plain.modules() if isinstance(m, BlockEmbedding))
    assert ref.table.lanes == 0
    for ids in (torch.tensor([0, 5, 5, emb.num_embeddings - 1, 3]), torch.tensor([7])):
        assert torch.equal(emb(ids), ref(ids))
    x = torch.randn(3, emb.embedding_dim)
    assert torch.equal(model.compute_logits(x), plain.compute_logits(x))


def test_repacking_can_be_switched_off(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:   # type: ignore[no-untyped-def]
    monkeypatch.setenv("HITENTER_REPACK", "0")
    model, _ = load_model(write_tiny_gguf(tmp_path / "m.gguf", quant="Q8_0", tied=False))
    assert not any(p.lanes for m in model.modules() if isinstance(m, BlockLinear) for p in m.parts)
