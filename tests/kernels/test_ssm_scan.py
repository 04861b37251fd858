"""The native causal conv and Mamba2 scan (csrc/recurrent/ssm_scan.c) against their torch references
(hitenter/kernels/ssm_scan.py): the conv and the scan's state bit-equal, the scan's output to float rounding;
and a span cut anywhere gives the bits of the whole span on the kernel."""

from __future__ import annotations

import pytest
import torch

from hitenter.kernels import ssm_scan
from hitenter.kernels.native import SSM_SCAN


@pytest.fixture
def native() -> None:
    if SSM_SCAN() is None:
        pytest.skip(f"ssm scan kernel not built: {SSM_SCAN.status}")


def _conv_inputs(n: int, c: int = 48, k: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return torch.randn(k - 1, c, generator=g), torch.randn(n, c, generator=g), torch.randn(c, k, generator=g)


def _scan_inputs(n: int, h: int = 8, p: int = 4, s: int = 16, groups: int = 2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(100 + n)
    dt = torch.nn.functional.softplus(torch.randn(n, h, generator=g))
    return (torch.randn(h, s, p, generator=g), torch.randn(n, h, p, generator=g), dt,
            torch.exp(-dt * torch.rand(h, generator=g) * 4), torch.randn(n, groups, s, generator=g),
            torch.randn(n, groups, s, generator=g))


@pytest.mark.parametrize("n", [1, 2, 7, 33])
def test_conv_kernel_bits_equal_the_reference(native: None, n: int) -> None:
    tail, x, w = _conv_inputs(n)
    t1, t2 = tail.clone(), tail.clone()
    assert torch.equal(ssm_scan.causal_conv(t1, x, w), ssm_scan.causal_conv_reference(t2, x, w))
    assert torch.equal(t1, t2) and torch.equal(t1, torch.cat([tail, x])[-3:])


@pytest.mark.parametrize("n", [1, 5, 20])
def test_scan_kernel_matches_the_reference(native: None, n: int) -> None:
    state, *rest = _scan_inputs(n)
    s1, s2 = state.clone(), state.clone()
    y1, y2 = ssm_scan.mamba2_scan(s1, *rest), ssm_scan.mamba2_scan_reference(s2, *rest)
    assert torch.equal(s1, s2)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)


def test_kernels_give_a_span_cut_anywhere_the_bits_of_the_whole(native: None) -> None:
    tail, x, w = _conv_inputs(30)
    whole = ssm_scan.causal_conv(tail.clone(), x, w)
    t = tail.clone()
    assert torch.equal(torch.cat([ssm_scan.causal_conv(t, x[a:b], w) for a, b in ((0, 1), (1, 12), (12, 30))]), whole)
    state, x, dt, da, b, c = _scan_inputs(30)
    whole = ssm_scan.mamba2_scan(state.clone(), x, dt, da, b, c)
    s = state.clone()
    parts = [ssm_scan.mamba2_scan(s, x[i:j], dt[i:j], da[i:j], b[i:j], c[i:j]) for i, j in ((0, 9), (9, 10), (10, 30))]
    assert torch.equal(torch.cat(parts), whole)


def test_scan_kernel_bits_do_not_depend_on_the_thread_count(native: None) -> None:
    state, *rest = _scan_inputs(9, h=12, p=32, s=64, groups=3)
    outs = []
    for threads in (1, 2, 5):
        s = state.clone()
        outs.append((ssm_scan.mamba2_scan(s, *rest, num_threads=threads), s))
    assert all(torch.equal(y, outs[0][0]) and torch.equal(s, outs[0][1]) for y, s in outs)
