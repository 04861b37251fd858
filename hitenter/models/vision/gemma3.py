"""The Gemma 3 vision tower (SigLIP) and projector, from an mmproj file's tensors, as llama.cpp's
clip_graph_siglip builds it for PROJECTOR_TYPE_GEMMA3 (tools/mtmd/models/siglip.cpp, clip.cpp build_vit):

    x = conv2d(pixels, v.patch_embd, stride = patch) + bias        -> [P, D] patches in row-major order
    x = x + v.position_embd
    per layer:  x = x + attn_out(MHA(LN(x, ln1)))                   (bidirectional, scale 1/sqrt(head_dim);
                                                                    torch's scaled_dot_product_attention)
                x = x + ffn_down(act(ffn_up(LN(x, ln2))))           (act: clip.use_gelu -> GELU, tanh form)
    x = LN(x, v.post_ln)
    x = avg_pool2d over the side x side patch grid, kernel = stride = merge   -> (side / merge)^2 rows
    x = RMSNorm(x, eps) * mm.soft_emb_norm
    y = x @ mm.input_projection                                     -> [tokens, text hidden]

Contract: Gemma3Vision(cfg, tensors)(pixels [3, S, S] float32) -> [cfg.tokens_per_image, projection_dim]
float32, the rows a text model takes in place of the image's soft tokens. Pure function of the pixels.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.models.vision.mmproj import MmprojConfig

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_quick": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
}


def _take(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    t = tensors.get(name)
    if t is None:
        raise ModelLoadError(f"the mmproj file lacks the tensor {name!r}")
    if shape is not None and tuple(t.shape) != shape:
        raise ModelLoadError(f"mmproj tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
    return t


class _Layer:
    """One encoder layer's weights (llama.cpp names; ffn_up / ffn_down swapped where the file stores them
    the old way round, as clip.cpp does)."""

    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor], i: int) -> None:
        d, p = cfg.hidden, f"v.blk.{i}."
        self.ln1 = (_take(tensors, p + "ln1.weight", (d,)), _take(tensors, p + "ln1.bias", (d,)))
        self.ln2 = (_take(tensors, p + "ln2.weight", (d,)), _take(tensors, p + "ln2.bias", (d,)))
        self.qkv_w = torch.cat([_take(tensors, p + f"attn_{n}.weight", (d, d)) for n in "qkv"])
        self.qkv_b = torch.cat([_take(tensors, p + f"attn_{n}.bias", (d,)) for n in "qkv"])
        self.out_w, self.out_b = _take(tensors, p + "attn_out.weight", (d, d)), _take(tensors, p + "attn_out.bias", (d,))
        up, up_b = _take(tensors, p + "ffn_up.weight"), _take(tensors, p + "ffn_up.bias")
        down, down_b = _take(tensors, p + "ffn_down.weight"), _take(tensors, p + "ffn_down.bias")
        if down.shape[-1] == d:   # stored swapped (clip.cpp is_ffn_swapped)
            up, up_b, down, down_b = down, down_b, up, up_b
        if tuple(up.shape) != (cfg.ffn, d) or tuple(down.shape) != (d, cfg.ffn):
            raise ModelLoadError(f"mmproj layer {i}: ffn_up / ffn_down shapes {tuple(up.shape)} / "
                                 f"{tuple(down.shape)} do not match hidden {d} and ffn {cfg.ffn}")
        self.up_w, self.up_b, self.down_w, self.down_b = up, up_b, down, down_b


class Gemma3Vision(nn.Module):
    """SigLIP encoder + Gemma 3 multimodal projector (see the module docstring)."""

    def __init__(self, cfg: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        if cfg.projector != "gemma3":
            raise ModelLoadError(f"Gemma3Vision cannot run the projector {cfg.projector!r}")
        d, ps, n = cfg.hidden, cfg.patch_size, cfg.patches_per_side ** 2
        self.cfg = cfg
        self.patch_w = _take(tensors, "v.patch_embd.weight", (d, 3, ps, ps))
        self.patch_b = tensors.get("v.patch_embd.bias")
        self.pos = _take(tensors, "v.position_embd.weight", (n, d))
        self.layers = [_Layer(cfg, tensors, i) for i in range(cfg.layers)]
        self.post_ln = (_take(tensors, "v.post_ln.weight", (d,)), _take(tensors, "v.post_ln.bias", (d,)))
        self.soft_norm = _take(tensors, "mm.soft_emb_norm.weight", (d,))
        self.proj = _take(tensors, "mm.input_projection.weight", (d, cfg.projection_dim))
        self.act = ACTIVATIONS[cfg.activation]

    def _attention(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        heads, n = self.cfg.heads, x.shape[0]
        # [3, 1, heads, n, d]: torch's CPU flash-attention kernel takes 4-D inputs only (3-D ones fall back to
        # the math path, which materializes the heads x n x n scores)
        qkv = F.linear(x, layer.qkv_w, layer.qkv_b).view(1, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], scale=1.0 / math.sqrt(qkv.shape[-1]))
        return F.linear(out[0].transpose(0, 1).reshape(n, -1), layer.out_w, layer.out_b)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """The tower's last hidden rows (after post_ln): [patches, hidden]."""
        cfg = self.cfg
        if tuple(pixels.shape) != (3, cfg.image_size, cfg.image_size):
            raise ValueError(f"expected pixels [3, {cfg.image_size}, {cfg.image_size}], got {tuple(pixels.shape)}")
        x = F.conv2d(pixels[None].float(), self.patch_w, self.patch_b, stride=cfg.patch_size)
        x = x.flatten(2)[0].T + self.pos
        for layer in self.layers:
            x = x + self._attention(F.layer_norm(x, (cfg.hidden,), *layer.ln1, eps=cfg.eps), layer)
            h = F.layer_norm(x, (cfg.hidden,), *layer.ln2, eps=cfg.eps)
            x = x + F.linear(self.act(F.linear(h, layer.up_w, layer.up_b)), layer.down_w, layer.down_b)
        return F.layer_norm(x, (cfg.hidden,), *self.post_ln, eps=cfg.eps)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pool the patch grid by `merge`, RMS-normalize, project to the text model's width."""
        cfg, side = self.cfg, self.cfg.patches_per_side
        grid = hidden.T.reshape(1, cfg.hidden, side, side)
        pooled = F.avg_pool2d(grid, cfg.merge, cfg.merge).reshape(cfg.hidden, -1).T
        normed = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + cfg.eps) * self.soft_norm
        return normed @ self.proj

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.project(self.encode(pixels))
