"""Mamba2's selective state-space mixer, as llama.cpp computes it (src/models/mamba-base.cpp
build_mamba2_layer, ggml-cpu's ssm_conv / ssm_scan). With E = ssm.inner_size, N = ssm.state_size,
G = ssm.group_count, Hs = ssm.time_step_rank heads of P = E / Hs, and C = E + 2 G N conv channels:

    z | xBC | dt = in_proj(h)                       (widths E, C, Hs)
    xBC = silu(conv(xBC) + conv_bias)               (depthwise causal conv, kernels/ssm_scan.py)
    x | B | C = xBC                                 (E = Hs x P, G x N, G x N; head h reads group h // (Hs / G))
    dt = softplus(dt + dt_bias)                     (ggml: x if x > 20 else log1p(exp(x)))
    per token, per head h:  S_h = S_h * exp(dt_h A_h) + B_g (x) (x_h dt_h)     (S_h [N, P])
                            y_h = C_g S_h + D_h x_h
    y = rms_groups(y * silu(z)) * ssm_norm          (an RMS norm over each of G groups of E / G)
    out = out_proj(y)

A is stored as the converter writes it, ssm_a = -exp(A_log) ([Hs, 1]); D as ssm_d [Hs, 1]. Tensors
(llama.cpp's names under ``blk.{i}.``): ssm_in, ssm_conv1d (.weight [C, K], .bias [C] optional),
ssm_dt.bias, ssm_a, ssm_d, ssm_norm.weight [G, E / G], ssm_out. State: ``conv`` [K - 1, C] (the tail of
xBC before the conv) and ``ssm`` [Hs, N, P] (kernels/ssm_scan.py's layout).

Where its kernel is built, everything between the projections runs fused (kernels/mamba2.py): the step's
generation rows in one call, each other span in its own, every row on the same per-token code.

Bit invariance (unfused): the conv and the scan run token by token on each sequence's own state
(kernels/ssm_scan.py: the native kernel, else its torch reference); the elementwise exp / softplus / silu run
through models/row_ops.rowwise (torch computes a tensor's tail elements on a scalar path whose bits can
differ).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.kernels.mamba2 import Mamba2Layer, mamba2_spans, softplus
from hitenter.kernels.ssm_scan import mamba2_scan
from hitenter.models.layers import make_linear
from hitenter.models.recurrent.base import RecurrentMixer, StateCache, for_each_span, single_rows
from hitenter.models.recurrent.causal_conv import causal_conv
from hitenter.models.row_ops import rowwise


def _dense(w: Any) -> torch.Tensor:
    return (w if isinstance(w, torch.Tensor) else w.dequantize()).float().contiguous()


class Mamba2(RecurrentMixer):
    """See the module docstring."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], p: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype, self.eps = dtype, cfg.rms_norm_eps
        self.inner, self.n_state, self.groups = cfg.ssm_inner_size, cfg.ssm_state_size, cfg.ssm_group_count
        self.heads = cfg.ssm_time_step_rank
        if self.inner % self.heads or self.heads % self.groups or self.inner % self.groups:
            raise ValueError(f"{p}: inner {self.inner}, heads {self.heads}, groups {self.groups} do not divide")
        self.channels = self.inner + 2 * self.groups * self.n_state
        self.in_proj = make_linear(w[p + "ssm_in.weight"], None, dtype)
        self.out_proj = make_linear(w[p + "ssm_out.weight"], None, dtype)
        self.taps = _dense(w[p + "ssm_conv1d.weight"])   # [C, K]
        bias = w.get(p + "ssm_conv1d.bias")
        self.conv_bias = torch.zeros(self.channels) if bias is None else _dense(bias)
        self.dt_bias = _dense(w[p + "ssm_dt.bias"])
        self.a = _dense(w[p + "ssm_a"]).reshape(self.heads)
        self.d = _dense(w[p + "ssm_d"]).reshape(self.heads)
        self.norm = _dense(w[p + "ssm_norm.weight"]).reshape(self.groups, self.inner // self.groups)
        self.fused = Mamba2Layer(self.inner, self.n_state, self.groups, self.heads, self.eps, self.taps.contiguous(),
                                 self.conv_bias.contiguous(), self.dt_bias.contiguous(), self.a.contiguous(),
                                 self.d.contiguous(), self.norm.reshape(-1).contiguous())

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"conv": (self.taps.shape[1] - 1, self.channels),
                "ssm": (self.heads, self.n_state, self.inner // self.heads)}

    def _fused(self, zs: torch.Tensor, attn: Any, cache: StateCache) -> torch.Tensor | None:
        """The recurrent part of every row on the fused kernel (kernels/mamba2.py): the generation rows of the
        step in one call, each other span in its own (saves taken between), or None where the kernel is not
        built. [T, E], padding rows zero."""
        out = torch.zeros(zs.shape[0], self.inner)
        singles = single_rows(attn)
        qsl = attn.query_start_loc
        if not mamba2_spans(self.fused, cache["conv"], cache["ssm"], [(qsl[i], 1, attn.state_slots[i]) for i in singles],
                            zs, out):
            return None

        def run(a: int, b: int, slot: int) -> None:
            mamba2_spans(self.fused, cache["conv"], cache["ssm"], [(a, b - a, slot)], zs, out)

        for_each_span(attn, cache, run, skip=set(singles))
        return out

    def forward(self, h: torch.Tensor, attn: Any, cache: StateCache) -> torch.Tensor:
        t, e, nh, g, n = h.shape[0], self.inner, self.heads, self.groups, self.n_state
        zxbcdt = self.in_proj(h).float()
        fused = self._fused(zxbcdt, attn, cache)
        if fused is not None:
            return self.out_proj(fused.to(self.dtype))
        z, xbc, dt = zxbcdt[:, :e], zxbcdt[:, e:e + self.channels], zxbcdt[:, e + self.channels:]
        dt = rowwise(softplus, dt + self.dt_bias)
        da = rowwise(torch.exp, dt * self.a)
        y = torch.zeros(t, nh, e // nh)   # padding rows stay zero

        def run(a: int, b: int, slot: int) -> None:
            u = causal_conv(cache["conv"][slot], xbc[a:b], self.taps) + self.conv_bias
            u = rowwise(F.silu, u)
            x = u[:, :e].reshape(b - a, nh, e // nh)
            bb, cc = u[:, e:e + g * n].reshape(b - a, g, n), u[:, e + g * n:].reshape(b - a, g, n)
            ys = mamba2_scan(cache["ssm"][slot], x, dt[a:b], da[a:b], bb, cc)
            y[a:b] = ys + x * self.d[:, None]

        for_each_span(attn, cache, run)
        gated = y.reshape(t, e) * rowwise(F.silu, z)
        normed = F.rms_norm(gated.reshape(t, g, e // g), (e // g,), eps=self.eps) * self.norm
        return self.out_proj(normed.reshape(t, e).to(self.dtype))
