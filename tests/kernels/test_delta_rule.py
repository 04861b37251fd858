"""The native gated delta rule (csrc/recurrent/delta_rule.c) against its torch reference (hitenter/kernels/delta_rule.py):
output and state to float rounding (the sums run in another order), the same bits on every ISA variant and
thread count, and a span cut anywhere gives the bits of the whole span, on the kernel and on the reference."""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch.nn import functional as F

from hitenter.kernels import delta_rule as dr
from hitenter.kernels.native import DELTA_RULE

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@pytest.fixture
def native() -> None:
    if DELTA_RULE() is None:
        pytest.skip(f"delta rule kernel not built: {DELTA_RULE.status}")


def _inputs(t: int, h: int, dk: int, dv: int, seed: int = 0) -> Inputs:
    """state [h, dk, dv], l2-normed q and k, v, g <= 0 and beta in (0, 1), as a Gated DeltaNet layer feeds."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(t, h, dk, generator=g), dim=-1)
    k = F.normalize(torch.randn(t, h, dk, generator=g), dim=-1)
    return (torch.randn(h, dk, dv, generator=g) * 0.3, q, k, torch.randn(t, h, dv, generator=g),
            -torch.rand(t, h, generator=g), torch.rand(t, h, generator=g))


@pytest.mark.parametrize("t, h, dk, dv", [(1, 4, 16, 16), (7, 4, 32, 32), (5, 16, 128, 128), (3, 2, 8, 24)])
def test_kernel_matches_the_reference(native: None, t: int, h: int, dk: int, dv: int) -> None:
    state, *rest = _inputs(t, h, dk, dv)
    s1, s2 = state.clone(), state.clone()
    o1 = dr.delta_rule(s1, *rest, dk ** -0.5)
    o2 = dr.delta_rule_reference(s2, *rest, dk ** -0.5)
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-6)
    assert not torch.equal(s1, state)


def test_reference_follows_the_delta_rule() -> None:
    """One token by hand: S' = S e^g + k (v - k S e^g) beta, o = q S' / sqrt(dk)."""
    state, q, k, v, g, beta = _inputs(1, 3, 8, 8, seed=5)
    s = state.clone()
    out = dr.delta_rule_reference(s, q, k, v, g, beta, 8 ** -0.5)
    decayed = state.double() * g.double().exp()[0][:, None, None]
    d = (v[0].double() - torch.einsum("hk,hkv->hv", k[0].double(), decayed)) * beta[0].double()[:, None]
    want = decayed + k[0].double()[:, :, None] * d[:, None, :]
    torch.testing.assert_close(s.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[0].double(), torch.einsum("hk,hkv->hv", q[0].double(), want) * 8 ** -0.5,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", ["native", "reference"])
def test_a_span_cut_anywhere_gives_the_bits_of_the_whole(native: None, path: str) -> None:
    run = dr.delta_rule if path == "native" else dr.delta_rule_reference
    state, q, k, v, g, beta = _inputs(30, 4, 32, 32, seed=1)
    whole_state = state.clone()
    whole = run(whole_state, q, k, v, g, beta, 0.25)
    s = state.clone()
    parts = [run(s, q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], 0.25) for a, b in ((0, 1), (1, 12), (12, 13), (13, 30))]
    assert torch.equal(torch.cat(parts), whole) and torch.equal(s, whole_state)


def test_thread_counts_give_the_same_bits(native: None) -> None:
    state, *rest = _inputs(6, 16, 64, 64, seed=2)
    s1, s2 = state.clone(), state.clone()
    assert torch.equal(dr.delta_rule(s1, *rest, 0.125, num_threads=1), dr.delta_rule(s2, *rest, 0.125, num_threads=2))
    assert torch.equal(s1, s2)


@pytest.mark.slow   # builds the AVX2 and portable copies
def test_every_isa_variant_gives_the_same_bits(native: None) -> None:
    """AVX-512, AVX2 and the portable build of csrc/recurrent/delta_rule.c, each loaded on its own (a test-only load)."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    outs = []
    for variant in DELTA_RULE.variants:
        fn = ctypes.CDLL(str(DELTA_RULE.build(variant))).delta_rule
        fn.argtypes, fn.restype = [p] * 7 + [i64] * 4 + [ctypes.c_float, ctypes.c_int], ctypes.c_int
        state, q, k, v, g, beta = _inputs(9, 8, 128, 128, seed=3)
        o = torch.empty(9, 8, 128)
        assert fn(state.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),
                  o.data_ptr(), 9, 8, 128, 128, 128 ** -0.5, 2) == 0
        outs.append((o, state))
    assert all(torch.equal(o, outs[0][0]) and torch.equal(s, outs[0][1]) for o, s in outs)


def test_bad_shapes_are_refused() -> None:
    state, q, k, v, g, beta = _inputs(2, 4, 16, 16)
    with pytest.raises(ValueError, match="do not fit"):
        dr.delta_rule(state, q[:, :3], k, v, g, beta, 0.25)
    with pytest.raises(ValueError, match="must be"):
        dr.delta_rule(state, q, k, v, g[:1], beta, 0.25)


@pytest.mark.parametrize("path", ["native", "reference"])
def test_rows_of_several_sequences_give_each_its_lone_bits(native: None, path: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """delta_rule_rows: row r through states[slots[r]], bit-equal to a one-token delta_rule call on that state
    (the kernel or, without it, the reference); the other slots untouched."""
    if path == "reference":
        monkeypatch.setattr(dr, "load", lambda: None)
    one = dr.delta_rule if path == "native" else dr.delta_rule_reference
    _, q, k, v, g, beta = _inputs(5, 16, 64, 64, seed=4)
    states = torch.randn(8, 16, 64, 64, generator=torch.Generator().manual_seed(9))
    slots = [6, 1, 3, 0, 7]
    want, alone = states.clone(), []
    for r, s in enumerate(slots):
        alone.append(one(want[s], q[r:r + 1], k[r:r + 1], v[r:r + 1], g[r:r + 1], beta[r:r + 1], 0.125))
    got = dr.delta_rule_rows(states, slots, q, k, v, g, beta, 0.125)
    assert torch.equal(got, torch.cat(alone)) and torch.equal(states, want)
    with pytest.raises(ValueError, match="distinct"):
        dr.delta_rule_rows(states, [1, 1, 2, 3, 4], q, k, v, g, beta, 0.125)
