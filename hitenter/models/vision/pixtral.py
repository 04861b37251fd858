"""The Pixtral vision encoder (Pixtral 12B; with the patch merger, Mistral Small 3.1 and Ministral 3) and its
LLaVA projector, from an mmproj file's tensors, as llama.cpp's clip_graph_pixtral builds them
(tools/mtmd/models/pixtral.cpp, clip.cpp build_vit and build_rope_2d):

    x = conv(pixels, v.patch_embd.weight) (+ bias)                     -> [P, D] patches row-major
    x = RMSNorm(x, v.pre_ln) where the file has it
    per layer:  x = x + attn_out(attention(rope2d(q), rope2d(k), v))     q, k, v over RMSNorm(x, ln1)
                x = x + ffn_down(act(ffn_gate(h)) * ffn_up(h))           h = RMSNorm(x, ln2); act SiLU (use_silu)
    with mm.patch_merger (spatial_merge_size m > 1):
        x = RMSNorm(x) * mm.input_norm; each m x m block of the patch grid unfolded (channel, row, column
        order, torch's unfold) and projected by mm.patch_merger
    y = mm.2(GELU(mm.1(x)))
    after each row of the token grid but the last, the row v.token_embd.img_break ([IMG_BREAK])

rope2d (ggml_rope_ext NORMAL, twice): each head's first half turns by the patch's row, the second by its
column, both in consecutive pairs (2j, 2j + 1), angle pos x 10000^(-4j/d), the column's also x
10000^(-2/d) (clip.cpp's interleaved frequencies; rope_theta is 10000 for Pixtral whatever the file says).

Contract: PixtralVision(cfg, tensors)(pixels [3, H, W] float32, H and W multiples of patch x merge) ->
[rows x cols + rows - 1, projection_dim] float32, the token grid row-major with the break rows. Pure.
"""

from __future__ import annotations

import torch
from torch import nn

from hitenter.errors import ModelLoadError
from hitenter.models.vision import qwen_vit as vit
from hitenter.models.vision.mmproj import MmprojConfig

ROPE_BASE = 10000.0


class _Layer:
    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor], i: int) -> None:
        d, p = cfg.hidden, f"v.blk.{i}."
        self.ln1 = vit.take(tensors, p + "ln1.weight", (d,))
        self.ln2 = vit.take(tensors, p + "ln2.weight", (d,))
        self.q, self.k, self.v, self.out = (vit.take_linear(tensors, p + n, (d, d), bias=False)
                                            for n in ("attn_q", "attn_k", "attn_v", "attn_out"))
        self.up = vit.take_linear(tensors, p + "ffn_up", (cfg.ffn, d), bias=False)
        self.down = vit.take_linear(tensors, p + "ffn_down", (d, cfg.ffn), bias=False)
        gate = vit.take(tensors, p + "ffn_gate.weight", (cfg.ffn, d), required=False)
        self.gate = None if gate is None else (gate, tensors.get(p + "ffn_gate.bias"))


def rope_tables(rows: torch.Tensor, cols: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [n, head_dim / 2] per consecutive pair: the first head_dim / 4 pairs by row, the rest by
    column (float32, the angle advanced by repeated multiplication as ggml's rope cache does)."""
    quarter = head_dim // 4
    scale = torch.tensor(ROPE_BASE, dtype=torch.float32) ** torch.tensor(-2.0 / (head_dim // 2))
    odd = torch.tensor(ROPE_BASE, dtype=torch.float32) ** torch.tensor(-2.0 / head_dim)
    angles = []
    for pos, freq_scale in ((rows, None), (cols, odd)):
        theta = pos.float()
        for _ in range(quarter):
            angles.append(theta if freq_scale is None else theta * freq_scale)
            theta = theta * scale
    a = torch.stack(angles, dim=-1)
    return torch.cos(a), torch.sin(a)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, d] rotated in consecutive pairs (2m, 2m + 1) by the tables [n, d/2] (NORMAL layout)."""
    pairs = x.view(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).reshape(x.shape)


class PixtralVision(nn.Module):
    """The Pixtral tower, optional patch merger and LLaVA projector (see the module docstring)."""

    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        if cfg.projector != "pixtral":
            raise ModelLoadError(f"PixtralVision cannot run the projector {cfg.projector!r}")
        d, ps, out = cfg.hidden, cfg.patch_size, cfg.projection_dim
        self.cfg = cfg
        self.patch_w = vit.take(tensors, "v.patch_embd.weight", (d, 3, ps, ps))
        self.patch_b = vit.take(tensors, "v.patch_embd.bias", (d,), required=False)
        self.pre_ln = vit.take(tensors, "v.pre_ln.weight", (d,), required=False)
        self.layers = [_Layer(cfg, tensors, i) for i in range(cfg.layers)]
        self.post_ln = vit.take(tensors, "v.post_ln.weight", (d,), required=False)
        merger = vit.take(tensors, "mm.patch_merger.weight", (d, d * cfg.merge ** 2), required=False)
        if merger is None and cfg.merge != 1:
            raise ModelLoadError(f"spatial_merge_size {cfg.merge} without the tensor 'mm.patch_merger.weight'")
        self.merger = None if merger is None else (vit.take(tensors, "mm.input_norm.weight", (d,)), merger)
        fc1 = vit.take(tensors, "mm.1.weight")
        if fc1.ndim != 2 or fc1.shape[1] != d:
            raise ModelLoadError(f"mmproj tensor 'mm.1.weight' has shape {tuple(fc1.shape)}, expected (*, {d})")
        self.fc1 = vit.take_linear(tensors, "mm.1", (int(fc1.shape[0]), d), bias=False)
        self.fc2 = vit.take_linear(tensors, "mm.2", (out, int(fc1.shape[0])), bias=False)
        self.img_break = vit.take(tensors, "v.token_embd.img_break", (out,))
        self.act, self.merger_act = vit.ACTIVATIONS[cfg.activation], vit.ACTIVATIONS["gelu"]

    def _rms(self, x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        return vit.norm(x, torch.ones(()) if w is None else w, None, self.cfg.eps, rms=True)

    def _block(self, x: torch.Tensor, layer: _Layer, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        n, heads = x.shape[0], self.cfg.heads
        h = self._rms(x, layer.ln1)
        q, k, v = (vit.linear(h, *lin).view(n, heads, -1) for lin in (layer.q, layer.k, layer.v))
        q, k = rotate_pairs(q, *cos_sin), rotate_pairs(k, *cos_sin)
        x = x + vit.linear(vit.attention(q, k, v), *layer.out)
        return x + vit.mlp(self._rms(x, layer.ln2), layer.up, layer.gate, layer.down, self.act)

    def _merge(self, x: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
        """RMSNorm x mm.input_norm, then each m x m block unfolded (channel, row, column) and projected."""
        m, (norm_w, proj) = self.cfg.merge, self.merger
        x = self._rms(x, None) * norm_w
        blocks = x.view(ph // m, m, pw // m, m, -1).permute(0, 2, 4, 1, 3)
        return blocks.reshape((ph // m) * (pw // m), -1) @ proj.T

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        ph, pw = vit.patch_grid(self.cfg, pixels)
        x = vit.patch_embed(pixels, self.patch_w, None, self.cfg.patch_size)
        if self.patch_b is not None:
            x = x + self.patch_b
        if self.pre_ln is not None:
            x = self._rms(x, self.pre_ln)
        idx = torch.arange(ph * pw)
        cos_sin = rope_tables(idx // pw, idx % pw, self.cfg.hidden // self.cfg.heads)
        for layer in self.layers:
            x = self._block(x, layer, cos_sin)
        if self.post_ln is not None:
            x = self._rms(x, self.post_ln)
        if self.merger is not None:
            x = self._merge(x, ph, pw)
        y = vit.linear(self.merger_act(vit.linear(x, *self.fc1)), *self.fc2)
        rows, cols = ph // self.cfg.merge, pw // self.cfg.merge
        grid = torch.cat([y.view(rows, cols, -1), self.img_break.expand(rows, 1, -1)], dim=1)
        return grid.reshape(rows * (cols + 1), -1)[:-1]
