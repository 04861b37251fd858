"""A Mamba2 layer's recurrent part, from its in_proj rows to the input of its out_proj, for the spans of a
step's sequences in one call (models/recurrent/mamba2.py states the layer).

With E inner channels in Hs heads of P, G groups of N state rows, Cc = E + 2 G N conv channels and
``z | xBC | dt`` an in_proj row (E, Cc, Hs wide), per token of a span, in order, on the span's slot of the
conv and ssm states:

    u          = silu(causal conv of xBC over the conv tail + conv_bias)   (kernels/ssm_scan.py's causal_conv)
    x | B | C  = u;  dt = softplus(dt + dt_bias);  da = exp(dt A)
    y          = mamba2_scan (kernels/ssm_scan.py) + D x
    out        = rms_norm per group of E / G (y * silu(z)) * norm

:func:`mamba2_span_reference` states one span in torch (the layer's unfused ops). :func:`mamba2_spans` runs
every span of the list in one native call (``csrc/recurrent/mamba2.c``: the scan's own code, the conv,
gates and norm beside it) where it is built, else returns False and the caller takes its unfused path. The
two agree to float rounding (tested); on the kernel a row's bits depend only on its sequence's tokens (a
one-token span and a generation row batched with others take the same code, on every ISA variant and
thread count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn import functional as F

from hitenter.kernels.native import MAMBA2
from hitenter.kernels.ssm_scan import causal_conv_reference, mamba2_scan_reference

__all__ = ["Mamba2Layer", "mamba2_span_reference", "mamba2_spans", "softplus"]

load = MAMBA2
Span = tuple[int, int, int]   # (first row, row count, slot)


def softplus(x: Tensor) -> Tensor:
    """ggml_compute_softplus_f32: x above 20, else log1p(exp(x))."""
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))


@dataclass(frozen=True)
class Mamba2Layer:
    """One layer's sizes and small weights (float32, contiguous): conv_w [Cc, K], conv_bias [Cc], dt_bias, a,
    d [Hs], norm [E] (the G groups' weights one after the other)."""

    inner: int
    n_state: int
    groups: int
    heads: int
    eps: float
    conv_w: Tensor
    conv_bias: Tensor
    dt_bias: Tensor
    a: Tensor
    d: Tensor
    norm: Tensor
    conv_wt: Tensor = field(init=False, repr=False)   # [K, Cc]: the kernel's layout of the taps

    def __post_init__(self) -> None:
        object.__setattr__(self, "conv_wt", self.conv_w.t().contiguous())

    @property
    def channels(self) -> int:
        return self.inner + 2 * self.groups * self.n_state


def mamba2_span_reference(layer: Mamba2Layer, conv: Tensor, ssm: Tensor, zs: Tensor) -> Tensor:
    """out [T, E] of one sequence's span in torch; conv [K - 1, Cc] and ssm [Hs, N, P] (its slot's states)
    updated in place; zs [T, E + Cc + Hs] its in_proj rows (float32)."""
    t, e, nh, g, n = zs.shape[0], layer.inner, layer.heads, layer.groups, layer.n_state
    z, xbc, dt = zs[:, :e], zs[:, e:e + layer.channels], zs[:, e + layer.channels:]
    dt = softplus(dt + layer.dt_bias)
    da = torch.exp(dt * layer.a)
    u = F.silu(causal_conv_reference(conv, xbc, layer.conv_w) + layer.conv_bias)
    x = u[:, :e].reshape(t, nh, e // nh)
    bb, cc = u[:, e:e + g * n].reshape(t, g, n), u[:, e + g * n:].reshape(t, g, n)
    y = mamba2_scan_reference(ssm, x, dt, da, bb, cc) + x * layer.d[:, None]
    gated = y.reshape(t, e) * F.silu(z)
    return (F.rms_norm(gated.reshape(t, g, e // g), (e // g,), eps=layer.eps) * layer.norm.reshape(g, -1)).reshape(t, e)


def mamba2_spans(layer: Mamba2Layer, conv: Tensor, ssm: Tensor, spans: list[Span], zs: Tensor, out: Tensor,
                 num_threads: int | None = None) -> bool:
    """Every span's rows of ``out [rows, E]`` (float32, contiguous) from ``zs [rows, E + Cc + Hs]`` (float32,
    rows contiguous), the spans' slots of ``conv [S, K - 1, Cc]`` and ``ssm [S, Hs, N, P]`` updated in place
    (slots distinct). False, touching nothing, where the kernel is not built or a tensor is not laid out for
    it: the caller then runs its unfused path."""
    lib = load()
    c, k, p = layer.channels, layer.conv_w.shape[1], layer.inner // layer.heads
    if (lib is None or k < 2 or not (conv.is_contiguous() and ssm.is_contiguous() and out.is_contiguous())
            or zs.stride(1) != 1 or zs.dtype != torch.float32 or conv.shape[1:] != (k - 1, c)
            or ssm.shape[1:] != (layer.heads, layer.n_state, p)):
        return False
    if len({s for _, _, s in spans}) != len(spans):
        raise ValueError(f"mamba2_spans: slots must be distinct, got {[s for _, _, s in spans]}")
    if not spans:
        return True
    if min(min(a, n) for a, n, _ in spans) < 0 or max(a + n for a, n, _ in spans) > min(zs.shape[0], out.shape[0]):
        raise ValueError(f"mamba2_spans: spans {spans} do not fit {zs.shape[0]} rows")
    row0, count, slot = (torch.tensor(col, dtype=torch.int64) for col in zip(*spans, strict=True))
    dims = torch.tensor([layer.inner, layer.n_state, layer.groups, layer.heads, k], dtype=torch.int64)
    fparams = torch.tensor([layer.eps], dtype=torch.float32)
    rc = lib.mamba2_spans(dims.data_ptr(), fparams.data_ptr(), layer.conv_wt.data_ptr(), layer.conv_bias.data_ptr(),
                          layer.dt_bias.data_ptr(), layer.a.data_ptr(), layer.d.data_ptr(), layer.norm.data_ptr(),
                          conv.data_ptr(), ssm.data_ptr(), row0.data_ptr(), count.data_ptr(), slot.data_ptr(),
                          len(spans), zs.data_ptr(), zs.stride(0), out.data_ptr(), num_threads or torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"mamba2_spans kernel failed ({rc})")
    return True
