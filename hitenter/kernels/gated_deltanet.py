"""A Gated DeltaNet layer's recurrent part, from its projections' rows to the input of its output projection,
for the spans of a step's sequences in one call (models/recurrent/gated_deltanet.py states the layer).

With ``x | z`` a row of the layer's in_proj (``C = 2 Hk dk + Hv dv`` then ``Hv dv`` wide) and ``b | a`` a row
of its ba_proj (``2 Hv``), per token of a span, in order, on the span's slot of the conv and ssm states:

    c      = silu(causal conv of x over the conv tail)            (kernels/ssm_scan.py's causal_conv)
    q, k   = l2_norm(c_q), l2_norm(c_k) per key head;  v = c_v
    beta   = sigmoid(b);  g = softplus(a + dt_bias) * A
    o      = delta rule (kernels/delta_rule.py) of value head h reading key head kh(h), scale 1 / sqrt(dk)
    y      = rms_norm(o_h, eps) * norm_w * silu(z_h) per value head

:func:`gdn_span_reference` states one span in torch (the same ops as the layer's unfused path).
:func:`gdn_spans` runs every span of the list in one native call (``csrc/recurrent/gated_deltanet.c``:
the delta rule's own code, the conv, norms and gates beside it) where it is built, else returns False and
the caller takes its unfused path. The two agree to float rounding (tested); on the kernel, a row's bits
depend only on its sequence's tokens: a one-token span and a generation row batched with others take the
same code, on every ISA variant and thread count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn import functional as F

from hitenter.kernels.delta_rule import delta_rule_reference
from hitenter.kernels.native import GATED_DELTANET
from hitenter.kernels.ssm_scan import causal_conv_reference

__all__ = ["GdnLayer", "gdn_span_reference", "gdn_spans", "l2_norm"]

load = GATED_DELTANET
Span = tuple[int, int, int]   # (first row, row count, slot)


@dataclass(frozen=True)
class GdnLayer:
    """One layer's sizes and small weights (float32, contiguous): conv_w [C, K], dt_bias, a [Hv], norm_w [dv];
    ``grouped``: value head h reads key head h // (Hv / Hk), else h % Hk."""

    hk: int
    dk: int
    hv: int
    dv: int
    grouped: bool
    eps: float
    conv_w: Tensor
    dt_bias: Tensor
    a: Tensor
    norm_w: Tensor
    conv_wt: Tensor = field(init=False, repr=False)   # [K, C]: the kernel's layout of the taps
    dims: Tensor = field(init=False, repr=False)      # the kernel's int64 sizes, made once
    fparams: Tensor = field(init=False, repr=False)   # the kernel's float32 eps and scale, made once

    def __post_init__(self) -> None:
        object.__setattr__(self, "conv_wt", self.conv_w.t().contiguous())
        k = self.conv_w.shape[1]
        object.__setattr__(self, "dims", torch.tensor([self.hk, self.dk, self.hv, self.dv, k, int(self.grouped)],
                                                      dtype=torch.int64))
        object.__setattr__(self, "fparams", torch.tensor([self.eps, self.dk ** -0.5], dtype=torch.float32))

    @property
    def channels(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv

    @property
    def key_head(self) -> Tensor:
        heads = torch.arange(self.hv)
        return heads // (self.hv // self.hk) if self.grouped else heads % self.hk


def l2_norm(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, n wide, computed as llama.cpp's build_gdn_l2_norm does:
    rms_norm(x, eps / n) / sqrt(n) (the fused row-wise norm, so a row's bits never depend on the row count)."""
    n = x.shape[-1]
    return F.rms_norm(x, (n,), None, eps / n) * (1.0 / n ** 0.5)


def gdn_span_reference(layer: GdnLayer, conv: Tensor, ssm: Tensor, x: Tensor, z: Tensor, ba: Tensor) -> Tensor:
    """y [T, Hv dv] of one sequence's span in torch; conv [K - 1, C] and ssm [Hv, dk, dv] (its slot's states)
    updated in place; x [T, C], z [T, Hv dv], ba [T, 2 Hv] float32."""
    t, kd = x.shape[0], layer.hk * layer.dk
    c = F.silu(causal_conv_reference(conv, x, layer.conv_w))
    q = l2_norm(c[:, :kd].reshape(t, layer.hk, layer.dk), layer.eps)[:, layer.key_head]
    k = l2_norm(c[:, kd:2 * kd].reshape(t, layer.hk, layer.dk), layer.eps)[:, layer.key_head]
    v = c[:, 2 * kd:].reshape(t, layer.hv, layer.dv)
    beta = torch.sigmoid(ba[:, :layer.hv]).contiguous()
    g = (F.softplus(ba[:, layer.hv:] + layer.dt_bias) * layer.a).contiguous()
    o = delta_rule_reference(ssm, q.contiguous(), k.contiguous(), v.contiguous(), g, beta, layer.dk ** -0.5)
    y = F.rms_norm(o, (layer.dv,), layer.norm_w, layer.eps) * F.silu(z).reshape(t, layer.hv, layer.dv)
    return y.reshape(t, -1)


def gdn_spans(layer: GdnLayer, conv: Tensor, ssm: Tensor, spans: list[Span], xz: Tensor, ba: Tensor, y: Tensor,
              num_threads: int | None = None) -> bool:
    """Every span's rows of ``y [rows, Hv dv]`` (float32, contiguous) from ``xz [rows, C + Hv dv]`` and
    ``ba [rows, 2 Hv]`` (float32, rows contiguous), the spans' slots of ``conv [S, K - 1, C]`` and
    ``ssm [S, Hv, dk, dv]`` updated in place (slots distinct). False, touching nothing, where the kernel is
    not built or a tensor is not laid out for it: the caller then runs its unfused path."""
    lib = load()
    c, k = layer.channels, layer.conv_w.shape[1]
    if (lib is None or k < 2 or not (conv.is_contiguous() and ssm.is_contiguous() and y.is_contiguous())
            or xz.stride(1) != 1 or ba.stride(1) != 1 or xz.dtype != torch.float32 or ba.dtype != torch.float32
            or conv.shape[1:] != (k - 1, c) or ssm.shape[1:] != (layer.hv, layer.dk, layer.dv)):
        return False
    if len({s for _, _, s in spans}) != len(spans):
        raise ValueError(f"gdn_spans: slots must be distinct, got {[s for _, _, s in spans]}")
    if not spans:
        return True
    if min(min(a, n) for a, n, _ in spans) < 0 or max(a + n for a, n, _ in spans) > min(xz.shape[0], ba.shape[0], y.shape[0]):
        raise ValueError(f"gdn_spans: spans {spans} do not fit {xz.shape[0]} rows")
    n = len(spans)
    cols = torch.tensor([col for span in spans for col in span], dtype=torch.int64).view(n, 3).t().contiguous()
    row0, count, slot = cols.data_ptr(), cols.data_ptr() + 8 * n, cols.data_ptr() + 16 * n   # [3, n]: each column's n
    rc = lib.gdn_spans(layer.dims.data_ptr(), layer.fparams.data_ptr(), layer.conv_wt.data_ptr(), layer.dt_bias.data_ptr(),
                       layer.a.data_ptr(), layer.norm_w.data_ptr(), conv.data_ptr(), ssm.data_ptr(), row0,
                       count, slot, n, xz.data_ptr(), xz.stride(0), ba.data_ptr(),
                       ba.stride(0), y.data_ptr(), num_threads or torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"gdn_spans kernel failed ({rc})")
    return True
