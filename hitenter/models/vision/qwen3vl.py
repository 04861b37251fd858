"""The Qwen3-VL vision transformer, patch merger and DeepStack mergers, from an mmproj file's tensors, as
llama.cpp's clip_graph_qwen3vl builds them (tools/mtmd/models/qwen3vl.cpp):

    x = conv(pixels, v.patch_embd.weight) + conv(pixels, v.patch_embd.weight.1) + v.patch_embd.bias
    x = x + v.position_embd resized to the patch grid (ggml_interpolate: bilinear, align corners), both
        in merge order (2 x 2 units; qwen_vit.py)
    per layer i:  x = x + attn_out(attention(rope(q), rope(k), v))   q, k, v from v.blk.i.attn_qkv over
                      LN(x, ln1); 2D vision RoPE by each patch's (row, column); every layer attends fully
                  x = x + ffn_down(act(ffn_up(LN(x, ln2))))        act: clip.use_gelu -> GELU (tanh form)
                  where v.deepstack.i.* exist: feature_i = fc2(GELU(fc1(LN(4 consecutive rows, norm))))
    y = mm.2(GELU(mm.0(4 consecutive rows of LN(x, v.post_ln))))
    out = [y, feature_i for each DeepStack layer i in order]   concatenated along the features

The text model (llama.cpp's qwen3vl / qwen3vlmoe, n_embd_inp = hidden x (1 + n_deepstack)) takes the first
projection_dim columns as the image rows' embeddings and adds the k-th DeepStack block to the hidden state
after its layer k - 1 (hitenter/models/deepstack.py).

Contract: Qwen3VLVision(cfg, tensors)(pixels [3, H, W] float32, H and W multiples of 2 x patch) ->
[(H / 2p) x (W / 2p), projection_dim x (1 + deepstack_count)] float32, the token grid row-major. Pure
function of the pixels.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hitenter.errors import ModelLoadError
from hitenter.models.vision import qwen_vit as vit
from hitenter.models.vision.mmproj import MmprojConfig


def interpolate_align_corners(table: torch.Tensor, side: int, out_h: int, out_w: int) -> torch.Tensor:
    """ggml_interpolate (bilinear | align corners) of a [side * side, D] row-major grid to [out_h * out_w, D]
    (float32 coordinates as ggml-cpu computes them)."""
    if (out_h, out_w) == (side, side):
        return table
    grid = table.view(side, side, -1)

    def axis(n_out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sf = torch.tensor((n_out - 1) / (side - 1) if n_out > 1 and side > 1 else n_out / side, dtype=torch.float32)
        pos = torch.arange(n_out, dtype=torch.float32) / sf
        i0 = torch.floor(pos).long()
        frac = (pos - i0.clamp(0, side - 1).float()).clamp(0.0, 1.0)
        return i0.clamp(0, side - 1), (i0 + 1).clamp(0, side - 1), frac

    y0, y1, dy = axis(out_h)
    x0, x1, dx = axis(out_w)
    dy, dx = dy[:, None, None], dx[None, :, None]
    a, b = grid[y0][:, x0], grid[y0][:, x1]
    c, d = grid[y1][:, x0], grid[y1][:, x1]
    out = a * (1 - dx) * (1 - dy) + b * dx * (1 - dy) + c * (1 - dx) * dy + d * dx * dy
    return out.reshape(out_h * out_w, -1)


class _Layer:
    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor], i: int) -> None:
        d, p = cfg.hidden, f"v.blk.{i}."
        self.ln1 = (vit.take(tensors, p + "ln1.weight", (d,)), vit.take(tensors, p + "ln1.bias", (d,)))
        self.ln2 = (vit.take(tensors, p + "ln2.weight", (d,)), vit.take(tensors, p + "ln2.bias", (d,)))
        self.qkv = vit.take_linear(tensors, p + "attn_qkv", (3 * d, d))
        self.out = vit.take_linear(tensors, p + "attn_out", (d, d))
        self.up = vit.take_linear(tensors, p + "ffn_up", (cfg.ffn, d))
        self.down = vit.take_linear(tensors, p + "ffn_down", (d, cfg.ffn))
        gate = vit.take(tensors, p + "ffn_gate.weight", (cfg.ffn, d), required=False)
        self.gate = None if gate is None else (gate, tensors.get(p + "ffn_gate.bias"))
        self.deepstack = None
        q = f"v.deepstack.{i}."
        if q + "fc1.weight" in tensors:
            fc1 = vit.take_linear(tensors, q + "fc1", None)
            if fc1[0].ndim != 2 or fc1[0].shape[1] != 4 * d:
                raise ModelLoadError(f"mmproj tensor {q}fc1.weight has shape {tuple(fc1[0].shape)}, "
                                     f"expected (*, {4 * d})")
            norm = (vit.take(tensors, q + "norm.weight", (4 * d,)), vit.take(tensors, q + "norm.bias", (4 * d,)))
            fc2 = vit.take_linear(tensors, q + "fc2", (cfg.projection_dim, int(fc1[0].shape[0])))
            self.deepstack = (norm, fc1, fc2)


class Qwen3VLVision(nn.Module):
    """The Qwen3-VL tower, merger and DeepStack mergers (see the module docstring)."""

    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        if cfg.projector != "qwen3vl_merger":
            raise ModelLoadError(f"Qwen3VLVision cannot run the projector {cfg.projector!r}")
        d, ps = cfg.hidden, cfg.patch_size
        self.cfg = cfg
        self.patch_w = (vit.take(tensors, "v.patch_embd.weight", (d, 3, ps, ps)),
                        vit.take(tensors, "v.patch_embd.weight.1", (d, 3, ps, ps)))
        self.patch_b = vit.take(tensors, "v.patch_embd.bias", (d,))
        pos = vit.take(tensors, "v.position_embd.weight")
        side = math.isqrt(int(pos.shape[0])) if pos.ndim == 2 else 0
        if pos.ndim != 2 or pos.shape[1] != d or side * side != pos.shape[0]:
            raise ModelLoadError(f"mmproj tensor 'v.position_embd.weight' has shape {tuple(pos.shape)}, "
                                 f"expected (n * n, {d})")
        self.pos, self.pos_side = pos, side
        self.layers = [_Layer(cfg, tensors, i) for i in range(cfg.layers)]
        self.post_ln = (vit.take(tensors, "v.post_ln.weight", (d,)), vit.take(tensors, "v.post_ln.bias", (d,)))
        fc1 = vit.take(tensors, "mm.0.weight")
        if fc1.ndim != 2 or fc1.shape[1] != 4 * d:
            raise ModelLoadError(f"mmproj tensor 'mm.0.weight' has shape {tuple(fc1.shape)}, expected (*, {4 * d})")
        self.fc1 = vit.take_linear(tensors, "mm.0", (int(fc1.shape[0]), 4 * d))
        self.fc2 = vit.take_linear(tensors, "mm.2", (cfg.projection_dim, int(fc1.shape[0])))
        self.act, self.merger_act = vit.ACTIVATIONS[cfg.activation], vit.ACTIVATIONS["gelu"]

    @property
    def deepstack_count(self) -> int:
        return sum(layer.deepstack is not None for layer in self.layers)

    @property
    def output_width(self) -> int:
        return self.cfg.projection_dim * (1 + self.deepstack_count)

    def _ln(self, x: torch.Tensor, wb: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return vit.norm(x, wb[0], wb[1], self.cfg.eps, rms=False)

    def _block(self, x: torch.Tensor, layer: _Layer, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        n, heads = x.shape[0], self.cfg.heads
        q, k, v = vit.linear(self._ln(x, layer.ln1), *layer.qkv).view(n, 3, heads, -1).unbind(1)
        q, k = vit.apply_rope(q, *cos_sin), vit.apply_rope(k, *cos_sin)
        x = x + vit.linear(vit.attention(q, k, v), *layer.out)
        return x + vit.mlp(self._ln(x, layer.ln2), layer.up, layer.gate, layer.down, self.act)

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        ph, pw = vit.patch_grid(self.cfg, pixels)
        order = vit.merge_order(ph, pw)
        pos = interpolate_align_corners(self.pos, self.pos_side, ph, pw)
        x = (vit.patch_embed(pixels, *self.patch_w, self.cfg.patch_size) + self.patch_b + pos)[order]
        cos_sin = vit.rope_tables(order // pw, order % pw, self.cfg.hidden // self.cfg.heads)
        features = []
        for layer in self.layers:
            x = self._block(x, layer, cos_sin)
            if layer.deepstack is not None:
                norm, fc1, fc2 = layer.deepstack
                h = self._ln(x.reshape(x.shape[0] // 4, -1), norm)
                features.append(vit.linear(self.merger_act(vit.linear(h, *fc1)), *fc2))
        y = vit.merger(self._ln(x, self.post_ln), self.fc1, self.fc2, self.merger_act)
        return torch.cat([y, *features], dim=-1)

