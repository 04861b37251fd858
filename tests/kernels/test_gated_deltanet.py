"""The fused Gated DeltaNet step (csrc/recurrent/gated_deltanet.c) against its torch reference
(hitenter/kernels/gated_deltanet.py gdn_span_reference): outputs and states to float rounding (the conv tails
exactly), and its bits independent of the batch, of where a span is cut, of the thread count and of the ISA
variant."""

from __future__ import annotations

import ctypes

import pytest
import torch

from hitenter.kernels import gated_deltanet as gd
from hitenter.kernels.native import GATED_DELTANET

Span = tuple[int, int, int]


@pytest.fixture
def native() -> None:
    if GATED_DELTANET() is None:
        pytest.skip(f"fused Gated DeltaNet kernel not built: {GATED_DELTANET.status}")


def _layer(hk: int, dk: int, hv: int, dv: int, grouped: bool, taps: int = 4, seed: int = 0) -> gd.GdnLayer:
    g = torch.Generator().manual_seed(seed)
    c = 2 * hk * dk + hv * dv
    return gd.GdnLayer(hk, dk, hv, dv, grouped, 1e-6, torch.randn(c, taps, generator=g) * 0.3,
                       torch.randn(hv, generator=g) * 0.3 - 0.5, -torch.rand(hv, generator=g) * 0.3,
                       torch.rand(dv, generator=g) + 0.5)


def _rows(layer: gd.GdnLayer, t: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """xz [t, C + Hv dv] and ba [t, 2 Hv] (in_proj and ba_proj rows)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, layer.channels + layer.hv * layer.dv, generator=g),
            torch.randn(t, 2 * layer.hv, generator=g) * 2)


def _states(layer: gd.GdnLayer, slots: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    taps = layer.conv_w.shape[1]
    return (torch.randn(slots, taps - 1, layer.channels, generator=g),
            torch.randn(slots, layer.hv, layer.dk, layer.dv, generator=g) * 0.3)


def _fused(layer: gd.GdnLayer, conv: torch.Tensor, ssm: torch.Tensor, spans: list[Span], xz: torch.Tensor,
           ba: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    y = torch.zeros(xz.shape[0], layer.hv * layer.dv)
    assert gd.gdn_spans(layer, conv, ssm, spans, xz, ba, y, num_threads=threads)
    return y


@pytest.mark.parametrize("hk, dk, hv, dv, grouped", [(2, 16, 2, 16, False), (2, 32, 4, 32, False),
                                                     (2, 32, 4, 32, True), (4, 128, 4, 128, False),
                                                     (1, 8, 2, 24, True)])
def test_kernel_matches_the_reference(native: None, hk: int, dk: int, hv: int, dv: int, grouped: bool) -> None:
    """Three sequences' spans (7 rows, 1 row, 2 rows) in one call, against the reference span by span."""
    layer = _layer(hk, dk, hv, dv, grouped)
    xz, ba = _rows(layer, 10)
    conv, ssm = _states(layer, 4)
    spans = [(0, 7, 2), (7, 1, 0), (8, 2, 3)]
    c1, s1 = conv.clone(), ssm.clone()
    got = _fused(layer, c1, s1, spans, xz, ba)
    c2, s2 = conv.clone(), ssm.clone()
    c = layer.channels
    want = torch.cat([gd.gdn_span_reference(layer, c2[s], s2[s], xz[a:a + n, :c], xz[a:a + n, c:], ba[a:a + n])
                      for a, n, s in spans])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch.equal(c1, c2)                    # the tails: copies of input rows
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-6)
    assert torch.equal(s1[1], ssm[1]) and torch.equal(c1[1], conv[1])   # a slot no span owns is untouched


def test_a_span_cut_anywhere_and_batched_rows_give_the_lone_bits(native: None) -> None:
    """One sequence's 12 rows in one span, in four (a one-row cut among them), and its rows as generation
    rows batched beside another sequence's: the same bits and state."""
    layer = _layer(2, 32, 4, 32, False)
    xz, ba = _rows(layer, 12)
    conv, ssm = _states(layer, 3)
    c_whole, s_whole = conv.clone(), ssm.clone()
    whole = _fused(layer, c_whole, s_whole, [(0, 12, 1)], xz, ba)
    c_cut, s_cut = conv.clone(), ssm.clone()
    cut = torch.cat([_fused(layer, c_cut, s_cut, [(0, b - a, 1)], xz[a:b], ba[a:b])
                     for a, b in ((0, 1), (1, 5), (5, 6), (6, 12))])
    assert torch.equal(cut, whole) and torch.equal(c_cut, c_whole) and torch.equal(s_cut, s_whole)
    other_xz, other_ba = _rows(layer, 12, seed=7)
    c_b, s_b = conv.clone(), ssm.clone()
    rows = []
    for t in range(12):   # step t: row t of sequence 1 (slot 1) beside row t of another (slot 2)
        pair_xz, pair_ba = torch.stack([other_xz[t], xz[t]]), torch.stack([other_ba[t], ba[t]])
        rows.append(_fused(layer, c_b, s_b, [(0, 1, 2), (1, 1, 1)], pair_xz, pair_ba)[1])
    assert torch.equal(torch.stack(rows), whole) and torch.equal(s_b[1], s_whole[1]) and torch.equal(c_b[1], c_whole[1])


def test_thread_counts_give_the_same_bits(native: None) -> None:
    layer = _layer(4, 64, 8, 64, True)
    xz, ba = _rows(layer, 40)
    conv, ssm = _states(layer, 2)
    outs = []
    for threads in (1, 2, 3):
        c, s = conv.clone(), ssm.clone()
        outs.append((_fused(layer, c, s, [(0, 33, 0), (33, 7, 1)], xz, ba, threads), c, s))
    assert all(all(torch.equal(a, b) for a, b in zip(o, outs[0], strict=True)) for o in outs)


@pytest.mark.slow   # builds the AVX2 and portable copies
def test_every_isa_variant_gives_the_same_bits(native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """AVX-512, AVX2 and the portable build of csrc/recurrent/gated_deltanet.c, each loaded on its own."""
    layer = _layer(2, 128, 4, 128, False)
    xz, ba = _rows(layer, 9)
    conv, ssm = _states(layer, 2)
    outs = []
    for variant in GATED_DELTANET.variants:
        lib = ctypes.CDLL(str(GATED_DELTANET.build(variant)))
        restype, argtypes = GATED_DELTANET.signatures["gdn_spans"]
        lib.gdn_spans.restype, lib.gdn_spans.argtypes = restype, list(argtypes)
        monkeypatch.setattr(gd, "load", lambda lib=lib: lib)
        c, s = conv.clone(), ssm.clone()
        outs.append((_fused(layer, c, s, [(0, 6, 1), (6, 3, 0)], xz, ba), c, s))
    assert all(all(torch.equal(a, b) for a, b in zip(o, outs[0], strict=True)) for o in outs)


def test_bad_spans_are_refused(native: None) -> None:
    layer = _layer(2, 16, 2, 16, False)
    xz, ba = _rows(layer, 4)
    conv, ssm = _states(layer, 3)
    y = torch.zeros(4, 32)
    with pytest.raises(ValueError, match="distinct"):
        gd.gdn_spans(layer, conv, ssm, [(0, 1, 1), (1, 1, 1)], xz, ba, y)
    with pytest.raises(ValueError, match="do not fit"):
        gd.gdn_spans(layer, conv, ssm, [(2, 3, 0)], xz, ba, y)


def test_without_the_kernel_the_caller_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kernel (or a state laid out otherwise): False and nothing touched, so the layer runs unfused."""
    monkeypatch.setattr(gd, "load", lambda: None)
    layer = _layer(2, 16, 2, 16, False)
    xz, ba = _rows(layer, 2)
    conv, ssm = _states(layer, 1)
    y = torch.zeros(2, 32)
    assert not gd.gdn_spans(layer, conv, ssm, [(0, 2, 0)], xz, ba, y)
    assert not y.any()
