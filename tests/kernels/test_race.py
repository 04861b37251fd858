"""The sampler's exponential race (hitenter.kernels.race): the native kernel against the torch / numpy
reference, the counter-based Exp(1) draws, and the race's distribution."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
import torch

from hitenter.kernels import race as R

native = pytest.mark.skipif(R.load() is None, reason="no C compiler: the reference is the only path")


def test_draws_are_exp1_and_depend_on_seed_and_index_only() -> None:
    q = R.race_q(5, np.arange(200_000))
    assert q.dtype == np.float32 and bool((q > 0).all()) and bool(np.isfinite(q).all())
    # Exp(1): mean 1, P(q > 1) = e^-1, P(q > 5) = e^-5 (5-sigma bounds)
    assert abs(float(q.mean()) - 1) < 0.012
    assert abs(float((q > 1).mean()) - math.exp(-1)) < 0.006
    assert abs(float((q > 5).mean()) - math.exp(-5)) < 0.0008
    other = R.race_q(6, np.arange(200_000))
    assert abs(float(np.corrcoef(q, other)[0, 1])) < 0.012          # seeds give independent streams
    assert abs(float(np.corrcoef(q[:-1], q[1:])[0, 1])) < 0.012     # neighbouring tokens too
    ids = np.array([7, 123_456, 3])
    assert np.array_equal(R.race_q(5, ids), q[ids])                  # q_i needs only (seed, i)
    u = R.race_uniforms(5, np.arange(1000))
    assert np.array_equal(u * 2**24 % 2, np.ones(1000))              # odd multiples of 2^-24: exact, in (0, 1)


def test_splitmix64_stream() -> None:
    # SplitMix64 (Steele, Lea, Flood 2014), seed 0: first outputs, from the published reference
    z = np.array([0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F], dtype=np.uint64)
    want = ((z >> np.uint64(41)).astype(np.int64) * 2 + 1) * 2.0**-24
    assert np.array_equal(R.race_uniforms(0, np.arange(3)).astype(np.float64), want)


@native
def test_kernel_q_matches_reference() -> None:
    lib = R.load()
    assert lib is not None
    ids = np.array([0, 1, 15, 16, 17, 49_151, 10**6, 2**40], dtype=np.int64)
    for seed in (0, 1, 2**63 + 5, 2**64 - 1):
        got = np.empty(len(ids), np.float32)
        lib.race_q(ctypes.c_uint64(seed), ids.ctypes.data, len(ids), got.ctypes.data)
        np.testing.assert_allclose(got, R.race_q(seed, ids), rtol=1e-6)


@native
@pytest.mark.parametrize("v", [5, 16, 37, 49_152])
def test_kernel_tokens_match_reference(v: int) -> None:
    g = torch.Generator().manual_seed(v)
    for scale in (0.5, 3.0, 20.0):
        x = torch.randn(24, v, generator=g) * scale
        x[:, 1::3] = -math.inf                 # filtered tokens
        seeds = [int(s) for s in torch.randint(0, 2**62, (24,), generator=g)]
        got, want = R.race(x, seeds), R.race_reference(x, seeds)
        p = torch.softmax(x, -1) / torch.from_numpy(np.stack([R.race_q(s, np.arange(v)) for s in seeds]))
        for r in range(24):     # equal, or a tie of the reference's scores to 1e-5
            assert got[r] == want[r] or float(p[r, got[r]]) >= float(p[r, want[r]]) * (1 - 1e-5)
        assert float(x.gather(1, got[:, None]).min()) > -math.inf   # never a filtered token
        assert torch.equal(R.race(x, seeds, num_threads=1), got)   # rows do not depend on the threads


@pytest.mark.parametrize("use_kernel", [True, False])
def test_race_samples_the_distribution(use_kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not use_kernel:
        monkeypatch.setattr(R, "load", lambda: None)
    elif R.load() is None:
        pytest.skip("no C compiler")
    p = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0])
    n = 20_000
    x = p.log().repeat(n, 1).contiguous()
    freq = torch.bincount(R.race(x, list(range(n))), minlength=6).double() / n
    sigma = (p * (1 - p) / n).sqrt().double()
    assert bool(((freq - p.double()).abs() <= 5 * sigma + 1e-12).all())     # and token 5 (p = 0) never


def test_edge_rows() -> None:
    v = 40
    x = torch.full((3, v), -math.inf)
    x[1, 17] = 0.0                           # one token left
    x[2] = torch.nan                         # nothing usable: token 0, as the reference's argmax
    for f in (R.race, R.race_reference):
        assert f(x, [1, 2, 3]).tolist() == [0, 17, 0]
    with pytest.raises(ValueError):
        R.race(x, [1])
    wide = torch.randn(4, 2 * v)[:, ::2]      # not contiguous: the reference
    assert R.race(wide, [1, 2, 3, 4]).tolist() == R.race_reference(wide, [1, 2, 3, 4]).tolist()


def test_greedy_argmax_is_torchs() -> None:
    """numpy's argmax in torch's place: the first maximum, NaN the maximum, -inf rows, ties, views, 1-D rows."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3001, generator=g)
    x[0, 17] = x[0, 2999] = float("nan")
    x[1] = float("-inf")
    x[2, 40] = x[2, 41] = x[2].max() + 1           # a tie: the first
    x[3, :] = 0.5
    x[4, 3000] = float("inf")
    for t in (x, x[1:4], x[:, ::2], x[:, 5:], x.t().contiguous().t(), x[2], x[0]):
        assert torch.equal(R.greedy_argmax(t), t.argmax(dim=-1))
    half = x.to(torch.bfloat16)                     # other dtypes keep torch's own
    assert torch.equal(R.greedy_argmax(half), half.argmax(dim=-1))
    assert R.greedy_argmax(x).dtype == torch.long
