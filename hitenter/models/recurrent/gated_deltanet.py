"""Gated DeltaNet (layer type "gated_deltanet"): the linear-attention layers of Qwen3.5 / 3.6 and Qwen3-Next,
as llama.cpp's qwen35 / qwen3next graphs compute them (build_layer_attn_linear, delta-net-base.cpp and the
ggml ops ssm_conv, l2_norm, gated_delta_net).

Sizes (ModelConfig): Hk = ssm_group_count key heads of dk = ssm_state_size, Hv = ssm_time_step_rank value
heads of dv = ssm_inner_size / Hv, conv channels C = 2 Hk dk + Hv dv, K = ssm_conv_kernel taps.
For the normed rows h of a sequence, token by token:

    x      = attn_qkv . h                                   # [C]: q (Hk dk) | k (Hk dk) | v (Hv dv)
    c      = silu(sum_i ssm_conv1d[:, i] * X[t - K + 1 + i])   # depthwise causal conv over the last K x's
    q, k   = l2(c_q) , l2(c_k) per key head                  # l2(u) = u / sqrt(sum u^2 + eps), eps = rms eps
    v      = c_v
    beta   = sigmoid(ssm_beta . h)                           # [Hv]
    g      = softplus(ssm_alpha . h + ssm_dt.bias) * ssm_a   # [Hv] (ssm_a = -exp(A_log), so g <= 0)
    o      = delta rule (kernels/delta_rule.py) with value head j reading key head j % Hk (Qwen3.5: the
             converter ordered the value heads for that) or j // (Hv / Hk) (ModelConfig.ssm_grouped_heads:
             Qwen3-Next), scale 1 / sqrt(dk)
    y      = ssm_out . (rms(o_j, ssm_norm) * silu(z_j)) per value head j, z = attn_gate . h

State per sequence (float32): ``conv`` [K - 1, C], the last K - 1 rows of x (zeros before the first token),
and ``ssm`` [Hv, dk, dv]. Projections run on all rows at once. Where its kernel is built, everything
between the projections (conv through the gated norm) runs fused (kernels/gated_deltanet.py): the step's
generation rows in one call, each other span in its own, every row on the same per-token code. Otherwise
(unfused) the conv (K shifted products summed in tap order over [tail ; the span's rows]) and the delta rule
run per sequence span, token by token (narrow elementwise ops through models/row_ops.py), so a row's bits
depend only on its sequence's tokens (the conv: models/recurrent/causal_conv.py); generation rows of several
sequences (one row each, no save due) go through the conv and the delta rule together, each with its
one-row span's arithmetic.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.kernels.delta_rule import delta_rule, delta_rule_rows
from hitenter.kernels.gated_deltanet import GdnLayer, gdn_spans, l2_norm
from hitenter.models.layers import fused_linear, make_linear
from hitenter.models.recurrent.base import RecurrentMixer, StateCache, for_each_span, single_rows
from hitenter.models.recurrent.causal_conv import causal_conv
from hitenter.models.row_ops import rowwise


def _dense(w: Any) -> torch.Tensor:
    return (w if isinstance(w, torch.Tensor) else w.dequantize()).float()


class GatedDeltaNet(RecurrentMixer):
    """One Gated DeltaNet layer (see the module docstring); weights under llama.cpp's names."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], p: str, dtype: torch.dtype) -> None:
        super().__init__()
        hk, dk, hv = cfg.ssm_group_count, cfg.ssm_state_size, cfg.ssm_time_step_rank
        if min(hk, dk, hv, cfg.ssm_inner_size, cfg.ssm_conv_kernel) <= 0 or hv % hk or cfg.ssm_inner_size % hv:
            raise ValueError(f"gated_deltanet: bad sizes: {hk} key heads of {dk}, {hv} value heads, inner "
                             f"{cfg.ssm_inner_size}, conv kernel {cfg.ssm_conv_kernel}")
        dv = cfg.ssm_inner_size // hv
        self.hk, self.dk, self.hv, self.dv, self.taps = hk, dk, hv, dv, cfg.ssm_conv_kernel
        self.channels = 2 * hk * dk + hv * dv
        self.eps, self.dtype = cfg.rms_norm_eps, dtype
        self.in_proj = fused_linear([w[p + "attn_qkv.weight"], w[p + "attn_gate.weight"]], None, dtype)
        self.ba_proj = fused_linear([w[p + "ssm_beta.weight"], w[p + "ssm_alpha.weight"]], None, dtype)
        self.out_proj = make_linear(w[p + "ssm_out.weight"], None, dtype)
        self.conv_w = _dense(w[p + "ssm_conv1d.weight"]).reshape(self.channels, self.taps).contiguous()
        self.dt_bias = _dense(w[p + "ssm_dt.bias"]).reshape(hv)
        self.a = _dense(w[p + "ssm_a"]).reshape(hv)
        self.norm_w = _dense(w[p + "ssm_norm.weight"]).reshape(dv)
        heads = torch.arange(hv)
        self.key_head = heads // (hv // hk) if cfg.ssm_grouped_heads else heads % hk
        self.scale = dk ** -0.5
        self.fused = GdnLayer(hk, dk, hv, dv, cfg.ssm_grouped_heads, self.eps, self.conv_w, self.dt_bias.contiguous(),
                              self.a.contiguous(), self.norm_w.contiguous())

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"conv": (self.taps - 1, self.channels), "ssm": (self.hv, self.dk, self.dv)}

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv output's rows [n, C] -> silu -> q, k (l2-normed, repeated to value heads), v."""
        c = rowwise(F.silu, x)
        kd = self.hk * self.dk
        q = l2_norm(c[:, :kd].reshape(-1, self.hk, self.dk), self.eps)[:, self.key_head]
        k = l2_norm(c[:, kd:2 * kd].reshape(-1, self.hk, self.dk), self.eps)[:, self.key_head]
        return q, k, c[:, 2 * kd:].reshape(-1, self.hv, self.dv)

    def _single_rows(self, rows: list[int], slots: list[int], x: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, cache: StateCache, o: torch.Tensor) -> None:
        """Generation rows of several sequences at once, each with its one-row span's arithmetic: the conv as
        causal_conv's tap-ordered sum over [tail ; row], the delta rule by delta_rule_rows."""
        tails = cache["conv"][slots]                                   # [N, K - 1, C]
        u = torch.cat([tails, x[rows][:, None]], 1)                    # [N, K, C]
        y = u[:, 0] * self.conv_w[:, 0]
        for i in range(1, self.taps):
            y = y + u[:, i] * self.conv_w[:, i]
        cache["conv"][slots] = u[:, 1:]
        q, k, v = self._qkv(y)
        o[rows] = delta_rule_rows(cache["ssm"], slots, q, k, v, g[rows], beta[rows], self.scale)

    def _fused(self, xz: torch.Tensor, ba: torch.Tensor, attn: Any, cache: StateCache) -> torch.Tensor | None:
        """The recurrent part of every row on the fused kernel (kernels/gated_deltanet.py): the generation rows
        of the step in one call, each other span in its own (saves taken between), or None where the kernel is
        not built. y [T, Hv dv], padding rows zero."""
        y = torch.zeros(xz.shape[0], self.hv * self.dv)
        singles = single_rows(attn)
        qsl = attn.query_start_loc
        one_rows = [(qsl[i], 1, attn.state_slots[i]) for i in singles]
        if not gdn_spans(self.fused, cache["conv"], cache["ssm"], one_rows, xz, ba, y):
            return None

        def run(a: int, b: int, slot: int) -> None:
            gdn_spans(self.fused, cache["conv"], cache["ssm"], [(a, b - a, slot)], xz, ba, y)

        for_each_span(attn, cache, run, skip=set(singles))
        return y

    def forward(self, h: torch.Tensor, attn: Any, cache: StateCache) -> torch.Tensor:
        t = h.shape[0]
        xz = self.in_proj(h).float()
        ba = self.ba_proj(h).float()
        fused = self._fused(xz, ba, attn, cache)
        if fused is not None:
            return self.out_proj(fused.to(self.dtype))
        x, z = xz[:, :self.channels], xz[:, self.channels:]
        beta = rowwise(torch.sigmoid, ba[:, :self.hv])
        g = rowwise(F.softplus, ba[:, self.hv:] + self.dt_bias) * self.a
        o = torch.zeros(t, self.hv, self.dv)

        def run(a: int, b: int, slot: int) -> None:
            q, k, v = self._qkv(causal_conv(cache["conv"][slot], x[a:b], self.conv_w))
            o[a:b] = delta_rule(cache["ssm"][slot], q, k, v, g[a:b].contiguous(), beta[a:b].contiguous(), self.scale)

        singles = single_rows(attn) if self.taps > 1 else []
        if len(singles) > 1:
            qsl = attn.query_start_loc
            self._single_rows([qsl[i] for i in singles], [attn.state_slots[i] for i in singles], x, g, beta, cache, o)
        for_each_span(attn, cache, run, skip=set(singles) if len(singles) > 1 else ())
        y = F.rms_norm(o, (self.dv,), self.norm_w, self.eps) * rowwise(F.silu, z).reshape(t, self.hv, self.dv)
        return self.out_proj(y.reshape(t, -1).to(self.dtype))
