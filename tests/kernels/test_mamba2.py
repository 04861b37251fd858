"""The fused Mamba2 step (csrc/recurrent/mamba2.c) against its torch reference (hitenter/kernels/mamba2.py
mamba2_span_reference): outputs and states to float rounding (the conv tails exactly), and its bits
independent of the batch, of where a span is cut, of the thread count and of the ISA variant."""

from __future__ import annotations

import ctypes

import pytest
import torch

from hitenter.kernels import mamba2 as m2
from hitenter.kernels.native import MAMBA2

Span = tuple[int, int, int]


@pytest.fixture
def native() -> None:
    if MAMBA2() is None:
        pytest.skip(f"fused Mamba2 kernel not built: {MAMBA2.status}")


def _layer(inner: int, n_state: int, groups: int, heads: int, taps: int = 4, seed: int = 0) -> m2.Mamba2Layer:
    g = torch.Generator().manual_seed(seed)
    c = inner + 2 * groups * n_state
    return m2.Mamba2Layer(inner, n_state, groups, heads, 1e-5, torch.randn(c, taps, generator=g) * 0.3,
                          torch.randn(c, generator=g) * 0.1, torch.randn(heads, generator=g) * 0.5,
                          -torch.rand(heads, generator=g) - 0.1, torch.randn(heads, generator=g),
                          torch.rand(inner, generator=g) + 0.5)


def _rows(layer: m2.Mamba2Layer, t: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(t, layer.inner + layer.channels + layer.heads, generator=g)
    zs[:, -layer.heads:] *= 12   # dt + dt_bias on both sides of softplus's threshold (20)
    return zs


def _states(layer: m2.Mamba2Layer, slots: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    taps = layer.conv_w.shape[1]
    return (torch.randn(slots, taps - 1, layer.channels, generator=g),
            torch.randn(slots, layer.heads, layer.n_state, layer.inner // layer.heads, generator=g) * 0.3)


def _fused(layer: m2.Mamba2Layer, conv: torch.Tensor, ssm: torch.Tensor, spans: list[Span], zs: torch.Tensor,
           threads: int | None = None) -> torch.Tensor:
    out = torch.zeros(zs.shape[0], layer.inner)
    assert m2.mamba2_spans(layer, conv, ssm, spans, zs, out, num_threads=threads)
    return out


@pytest.mark.parametrize("inner, n_state, groups, heads", [(32, 16, 1, 2), (64, 16, 2, 4), (48, 8, 2, 6),
                                                          (256, 128, 1, 8)])
def test_kernel_matches_the_reference(native: None, inner: int, n_state: int, groups: int, heads: int) -> None:
    """Three sequences' spans (6 rows, 1 row, 2 rows) in one call, against the reference span by span."""
    layer = _layer(inner, n_state, groups, heads)
    zs = _rows(layer, 9)
    conv, ssm = _states(layer, 4)
    spans = [(0, 6, 2), (6, 1, 0), (7, 2, 3)]
    c1, s1 = conv.clone(), ssm.clone()
    got = _fused(layer, c1, s1, spans, zs)
    c2, s2 = conv.clone(), ssm.clone()
    want = torch.cat([m2.mamba2_span_reference(layer, c2[s], s2[s], zs[a:a + n]) for a, n, s in spans])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch.equal(c1, c2)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-6)
    assert torch.equal(s1[1], ssm[1]) and torch.equal(c1[1], conv[1])


def test_a_span_cut_anywhere_and_batched_rows_give_the_lone_bits(native: None) -> None:
    layer = _layer(64, 16, 2, 4)
    zs = _rows(layer, 12)
    conv, ssm = _states(layer, 3)
    c_whole, s_whole = conv.clone(), ssm.clone()
    whole = _fused(layer, c_whole, s_whole, [(0, 12, 1)], zs)
    c_cut, s_cut = conv.clone(), ssm.clone()
    cut = torch.cat([_fused(layer, c_cut, s_cut, [(0, b - a, 1)], zs[a:b]) for a, b in ((0, 1), (1, 5), (5, 6), (6, 12))])
    assert torch.equal(cut, whole) and torch.equal(c_cut, c_whole) and torch.equal(s_cut, s_whole)
    other = _rows(layer, 12, seed=7)
    c_b, s_b = conv.clone(), ssm.clone()
    rows = [_fused(layer, c_b, s_b, [(0, 1, 2), (1, 1, 1)], torch.stack([other[t], zs[t]]))[1] for t in range(12)]
    assert torch.equal(torch.stack(rows), whole) and torch.equal(s_b[1], s_whole[1]) and torch.equal(c_b[1], c_whole[1])


def test_thread_counts_give_the_same_bits(native: None) -> None:
    layer = _layer(256, 64, 2, 8)
    zs = _rows(layer, 40)
    conv, ssm = _states(layer, 2)
    outs = []
    for threads in (1, 2, 3):
        c, s = conv.clone(), ssm.clone()
        outs.append((_fused(layer, c, s, [(0, 33, 0), (33, 7, 1)], zs, threads), c, s))
    assert all(all(torch.equal(a, b) for a, b in zip(o, outs[0], strict=True)) for o in outs)


@pytest.mark.slow   # builds the AVX2 and portable copies
def test_every_isa_variant_gives_the_same_bits(native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer(256, 128, 1, 8)
    zs = _rows(layer, 9)
    conv, ssm = _states(layer, 2)
    outs = []
    for variant in MAMBA2.variants:
        lib = ctypes.CDLL(str(MAMBA2.build(variant)))
        restype, argtypes = MAMBA2.signatures["mamba2_spans"]
        lib.mamba2_spans.restype, lib.mamba2_spans.argtypes = restype, list(argtypes)
        monkeypatch.setattr(m2, "load", lambda lib=lib: lib)
        c, s = conv.clone(), ssm.clone()
        outs.append((_fused(layer, c, s, [(0, 6, 1), (6, 3, 0)], zs), c, s))
    assert all(all(torch.equal(a, b) for a, b in zip(o, outs[0], strict=True)) for o in outs)


def test_bad_spans_are_refused(native: None) -> None:
    layer = _layer(32, 16, 1, 2)
    zs = _rows(layer, 4)
    conv, ssm = _states(layer, 3)
    out = torch.zeros(4, 32)
    with pytest.raises(ValueError, match="distinct"):
        m2.mamba2_spans(layer, conv, ssm, [(0, 1, 1), (1, 1, 1)], zs, out)
    with pytest.raises(ValueError, match="do not fit"):
        m2.mamba2_spans(layer, conv, ssm, [(2, 3, 0)], zs, out)


def test_without_the_kernel_the_caller_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m2, "load", lambda: None)
    layer = _layer(32, 16, 1, 2)
    zs = _rows(layer, 2)
    conv, ssm = _states(layer, 1)
    out = torch.zeros(2, 32)
    assert not m2.mamba2_spans(layer, conv, ssm, [(0, 2, 0)], zs, out)
    assert not out.any()
