"""The Gemma 4 vision encoder and projector (mmproj projector type gemma4v), from an mmproj file's tensors, as
llama.cpp's clip_graph_gemma4v builds them (tools/mtmd/models/gemma4v.cpp, clip.cpp build_vit):

    x = conv(2 * pixels - 1, v.patch_embd.weight)                      -> [P, D] patches row-major (no bias)
    x = x + v.position_embd[0][column] + v.position_embd[1][row]       (the table [2, positions, D])
    per layer (RMSNorm everywhere, eps from the file; q/k/v/out, gate/up/down through mm(), see below):
        h = RMSNorm(x, ln1)
        q, k = RMSNorm per head (attn_q_norm / attn_k_norm) of mm(h, attn_q / attn_k), then rope2d
        v = rms(mm(h, attn_v)) per head, without a weight
        x = x + RMSNorm(mm(attention(q, k, v, scale 1), attn_out), attn_post_norm)
        x = x + RMSNorm(mm(act(mm(h2, ffn_gate)) * mm(h2, ffn_up), ffn_down), ffn_post_norm), h2 = RMSNorm(x, ln2)
        x = x * out_scale                                               (where the file has it)
    x = avg_pool2d over the patch grid, kernel = stride = merge (clip.vision.projector.scale_factor, default 3)
    x = x * sqrt(D);  x = (x - v.std_bias) * v.std_scale                (where the file has both)
    y = mm(rms(x), mm.input_projection)                                  -> [tokens, projection_dim]

mm(x, W) is Gemma4ClippableLinear: x clamped to [W.input_min, W.input_max], x @ W^T, then clamped to
[W.output_min, W.output_max], each bound a one-element tensor beside W where the file has it (unbounded
otherwise). act follows clip.use_gelu / use_silu (gelu_quick without either, as clip.cpp reads a file).

rope2d (two ggml_rope_ext NEOX calls, base 100 whatever the file says): the first half of each head turns by
the patch's column, the second half by its row; within a half of h = d/2 dims the pairs are (i, i + h/2),
angle pos x 100^(-2i/h), advanced by repeated multiplication as ggml's rope cache does.

Contract: Gemma4Vision(cfg, tensors)(pixels [3, H, W] float32, H and W multiples of patch x merge, at most
the position table's length of patches per side) -> [(H / patch / merge) x (W / patch / merge),
projection_dim] float32, the token grid row-major. Pure function of the pixels.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.models.vision import qwen_vit as vit
from hitenter.models.vision.mmproj import MmprojConfig

ROPE_BASE = 100.0
Clamp = tuple[float, float, float, float]   # input min, input max, output min, output max
UNBOUNDED: Clamp = (-math.inf, math.inf, -math.inf, math.inf)


def _scalar(tensors: dict[str, torch.Tensor], name: str, default: float) -> float:
    t = tensors.get(name)
    if t is None:
        return default
    if t.numel() != 1:
        raise ModelLoadError(f"mmproj tensor {name!r} must hold one value, it has {t.numel()}")
    return float(t.reshape(-1)[0])


class ClippedLinear:
    """A bias-free projection with Gemma4ClippableLinear's optional input and output clamps."""

    def __init__(self, tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, int]) -> None:
        self.w = vit.take(tensors, name + ".weight", shape)
        self.clamp: Clamp = (_scalar(tensors, name + ".input_min", -math.inf),
                             _scalar(tensors, name + ".input_max", math.inf),
                             _scalar(tensors, name + ".output_min", -math.inf),
                             _scalar(tensors, name + ".output_max", math.inf))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi, out_lo, out_hi = self.clamp
        if self.clamp == UNBOUNDED:
            return F.linear(x, self.w)
        return F.linear(x.clamp(lo, hi), self.w).clamp(out_lo, out_hi)


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ggml_rms_norm over the last dim, times `weight` where given (torch's fused op)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class _Layer:
    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor], i: int) -> None:
        d, p, hd = cfg.hidden, f"v.blk.{i}.", cfg.hidden // cfg.heads
        self.ln1 = vit.take(tensors, p + "ln1.weight", (d,))
        self.ln2 = vit.take(tensors, p + "ln2.weight", (d,))
        self.q, self.k, self.v, self.out = (ClippedLinear(tensors, p + n, (d, d))
                                            for n in ("attn_q", "attn_k", "attn_v", "attn_out"))
        self.q_norm = vit.take(tensors, p + "attn_q_norm.weight", (hd,), required=False)
        self.k_norm = vit.take(tensors, p + "attn_k_norm.weight", (hd,), required=False)
        self.attn_post_norm = vit.take(tensors, p + "attn_post_norm.weight", (d,), required=False)
        self.ffn_post_norm = vit.take(tensors, p + "ffn_post_norm.weight", (d,), required=False)
        self.gate = ClippedLinear(tensors, p + "ffn_gate", (cfg.ffn, d))
        self.up = ClippedLinear(tensors, p + "ffn_up", (cfg.ffn, d))
        self.down = ClippedLinear(tensors, p + "ffn_down", (d, cfg.ffn))
        scale = vit.take(tensors, p + "out_scale.weight", required=False)
        if scale is not None and scale.numel() not in (1, d):
            raise ModelLoadError(f"mmproj tensor '{p}out_scale.weight' has {scale.numel()} values, expected 1 or {d}")
        self.out_scale = None if scale is None else scale.reshape(-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, d]: each half rotated NEOX-style (pairs (i, i + d/4) within it) by its half of the tables."""
    q = x.shape[-1] // 4
    return torch.cat([vit.apply_rope(x[..., :2 * q], cos[:, :q], sin[:, :q]),
                      vit.apply_rope(x[..., 2 * q:], cos[:, q:], sin[:, q:])], dim=-1)


class Gemma4Vision(nn.Module):
    """The Gemma 4 vision tower, pooler and projector (see the module docstring)."""

    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        if cfg.projector != "gemma4v":
            raise ModelLoadError(f"Gemma4Vision cannot run the projector {cfg.projector!r}")
        d, ps = cfg.hidden, cfg.patch_size
        self.cfg = cfg
        self.patch_w = vit.take(tensors, "v.patch_embd.weight", (d, 3, ps, ps))
        pos = vit.take(tensors, "v.position_embd.weight")
        if pos.ndim != 3 or pos.shape[0] != 2 or pos.shape[2] != d:
            raise ModelLoadError(f"mmproj tensor 'v.position_embd.weight' has shape {tuple(pos.shape)}, "
                                 f"expected (2, positions, {d})")
        self.pos = pos
        self.layers = [_Layer(cfg, tensors, i) for i in range(cfg.layers)]
        self.post_ln = vit.take(tensors, "v.post_ln.weight", (d,), required=False)
        self.post_ln_b = vit.take(tensors, "v.post_ln.bias", (d,), required=False)
        std_bias = vit.take(tensors, "v.std_bias", (d,), required=False)
        std_scale = vit.take(tensors, "v.std_scale", (d,), required=False)
        self.standardize = None if std_bias is None or std_scale is None else (std_bias, std_scale)
        self.proj = ClippedLinear(tensors, "mm.input_projection", (cfg.projection_dim, d))
        self.act = vit.ACTIVATIONS[cfg.activation]

    @property
    def max_side(self) -> int:
        """Patches per side the position table covers."""
        return int(self.pos.shape[1])

    def _block(self, x: torch.Tensor, layer: _Layer, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        cfg, n = self.cfg, x.shape[0]
        eps, heads = cfg.eps, cfg.heads
        h = rms(x, layer.ln1, eps)
        q, k, v = (lin(h).view(n, heads, -1) for lin in (layer.q, layer.k, layer.v))
        q, k = rms(q, layer.q_norm, eps), rms(k, layer.k_norm, eps)
        q, k, v = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin), rms(v, None, eps)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           scale=1.0)
        o = layer.out(o[0].transpose(0, 1).reshape(n, -1))
        if layer.attn_post_norm is not None:
            o = rms(o, layer.attn_post_norm, eps)
        x = x + o
        h = rms(x, layer.ln2, eps)
        f = layer.down(self.act(layer.gate(h)) * layer.up(h))
        if layer.ffn_post_norm is not None:
            f = rms(f, layer.ffn_post_norm, eps)
        x = x + f
        return x if layer.out_scale is None else x * layer.out_scale

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """The tower's last hidden rows: [patches, hidden], row-major."""
        cfg = self.cfg
        ph, pw = vit.patch_grid(cfg, pixels)
        if max(ph, pw) > self.max_side:
            raise ValueError(f"an image of {ph} x {pw} patches is over the position table's {self.max_side} per side")
        x = vit.patch_embed(pixels * 2.0 - 1.0, self.patch_w, None, cfg.patch_size)
        idx = torch.arange(ph * pw)
        rows, cols = idx // pw, idx % pw
        x = x + self.pos[0][cols] + self.pos[1][rows]
        cos_sin = vit.rope_tables(cols, rows, cfg.hidden // cfg.heads, ROPE_BASE)   # columns first
        for layer in self.layers:
            x = self._block(x, layer, cos_sin)
        if self.post_ln is not None:
            x = rms(x, self.post_ln, cfg.eps)
            if self.post_ln_b is not None:
                x = x + self.post_ln_b
        return x

    def project(self, hidden: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
        """Pool the patch grid by `merge`, scale, standardize, RMS-normalize, project: [tokens, projection_dim]."""
        cfg, m = self.cfg, self.cfg.merge
        grid = hidden.T.reshape(1, cfg.hidden, ph, pw)
        x = F.avg_pool2d(grid, m, m).reshape(cfg.hidden, -1).T * math.sqrt(cfg.hidden)
        if self.standardize is not None:
            x = (x - self.standardize[0]) * self.standardize[1]
        return self.proj(rms(x, None, cfg.eps))

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        ph, pw = vit.patch_grid(self.cfg, pixels)
        return self.project(self.encode(pixels), ph, pw)
