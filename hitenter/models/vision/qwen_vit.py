"""The pieces the Qwen-VL vision transformers share (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; Pixtral takes the
generic ones: patch GEMM, attention, norms, MLP), as llama.cpp's tools/mtmd/models/qwen2vl.cpp and
qwen3vl.cpp build them:

- the patch embedding: Qwen's 3D patch (2 frames x patch x patch) split by the converter into two 2D
  kernels (v.patch_embd.weight and .weight.1); a still image is both frames, so the two convolutions of the
  same pixels are added;
- the merge order: patches are laid out by 2 x 2 merge units (for each unit row, each unit, its 4 patches
  row-major), the order the whole tower keeps, so the merger's rows are 4 consecutive patches;
- the 2D vision RoPE (ggml_rope_multi, GGML_ROPE_TYPE_VISION, sections d/4 x 4, base 10000): pairs (k,
  k + d/2) of each head rotate by the patch's row for k < d/4 and by its column for d/4 <= k < d/2, angle
  pos x 10000^(-4j/d) with j the index within the section;
- attention (scale 1/sqrt(d); all rows, or within contiguous windows of rows: llama.cpp's block-diagonal
  mask run window by window, so memory grows with the largest window, not the square of the image),
  LayerNorm / RMSNorm, the MLP (up, optional
  gate: act(gate) * up, down; biases where the file has them) and the GELU merger mm.0 -> GELU -> mm.2.

Contract: pure tensor functions on fp32 tensors; weights by llama.cpp's names (take() raises
ModelLoadError for a missing or misshapen tensor).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.models.vision.mmproj import MmprojConfig

Linear = tuple[torch.Tensor, "torch.Tensor | None"]   # (weight [out, in], bias [out] or None)
Activation = Callable[[torch.Tensor], torch.Tensor]
ROPE_BASE = 10000.0
ACTIVATIONS: dict[str, Activation] = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_quick": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
}


def take(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...] | None = None,
         required: bool = True) -> torch.Tensor | None:
    """The tensor `name` (checked against `shape`); None for an absent optional one."""
    t = tensors.get(name)
    if t is None:
        if required:
            raise ModelLoadError(f"the mmproj file lacks the tensor {name!r}")
        return None
    if shape is not None and tuple(t.shape) != shape:
        raise ModelLoadError(f"mmproj tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
    return t


def merge_order(ph: int, pw: int) -> torch.Tensor:
    """Row-major patch indices in merge-unit order (see the module docstring): [ph * pw]."""
    yb, xb, dy, dx = torch.meshgrid(torch.arange(ph // 2), torch.arange(pw // 2), torch.arange(2),
                                    torch.arange(2), indexing="ij")
    return ((2 * yb + dy) * pw + 2 * xb + dx).reshape(-1)


def patch_grid(cfg: MmprojConfig, pixels: torch.Tensor) -> tuple[int, int]:
    """(rows, columns) of patches of a [3, H, W] image; ValueError unless both sides are multiples of
    patch x merge."""
    align = cfg.merge * cfg.patch_size
    if pixels.ndim != 3 or pixels.shape[0] != 3 or pixels.shape[1] % align or pixels.shape[2] % align \
            or pixels.shape[1] == 0 or pixels.shape[2] == 0:
        raise ValueError(f"expected pixels [3, H, W] with H and W multiples of {align}, got {tuple(pixels.shape)}")
    return pixels.shape[1] // cfg.patch_size, pixels.shape[2] // cfg.patch_size


def patch_embed(pixels: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor | None, patch: int) -> torch.Tensor:
    """The convolutions (stride = kernel = patch) of the pixels by w0 and w1 (both temporal halves of
    the same frame; w1 None: one kernel), added, as one GEMM each over the patches: [ph * pw, D] in
    row-major order."""
    c, h, w = pixels.shape
    x = pixels.to(w0.dtype).reshape(c, h // patch, patch, w // patch, patch).permute(1, 3, 0, 2, 4)
    x = x.reshape((h // patch) * (w // patch), c * patch * patch)
    y = x @ w0.reshape(w0.shape[0], -1).T
    return y if w1 is None else y + x @ w1.reshape(w1.shape[0], -1).T


def rope_tables(first: torch.Tensor, second: torch.Tensor, head_dim: int,
                base: float = ROPE_BASE) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [n, head_dim / 2] of the 2D vision RoPE: the first head_dim / 4 angles by `first` (Qwen:
    rows), the rest by `second` (float32, the angle advanced by repeated multiplication as ggml's rope
    cache does)."""
    quarter = head_dim // 4
    scale = torch.tensor(base, dtype=torch.float32) ** torch.tensor(-2.0 / (head_dim // 2))
    angles = []
    for pos in (first, second):
        theta = pos.float()
        for _ in range(quarter):
            angles.append(theta)
            theta = theta * scale
    a = torch.stack(angles, dim=-1)
    return torch.cos(a), torch.sin(a)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, d] rotated in pairs (k, k + d/2) by the tables [n, d/2] (NEOX layout)."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              windows: list[tuple[int, int]] | None = None) -> torch.Tensor:
    """Bidirectional multi-head attention: q, k, v [n, heads, d] -> [n, heads * d]; with `windows`
    (contiguous [start, stop) ranges covering the rows), each row attends within its window only."""
    n = q.shape[0]
    # [1, heads, n, d]: torch's CPU flash-attention kernel takes 4-D inputs only (3-D ones fall back to the
    # math path, which materializes the heads x n x n scores)
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    scale = 1.0 / math.sqrt(q.shape[-1])
    if windows is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, scale=scale)
    else:
        out = torch.cat([F.scaled_dot_product_attention(qh[:, :, a:b], kh[:, :, a:b], vh[:, :, a:b], scale=scale)
                         for a, b in windows], dim=2)
    return out[0].transpose(0, 1).reshape(n, -1)


def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool) -> torch.Tensor:
    """RMSNorm (Qwen2.5-VL) or LayerNorm (Qwen2-VL, Qwen3-VL) over the last dim, then weight (+ bias)."""
    if rms:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
        return y if bias is None else y + bias
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=eps)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, w, b)


def take_linear(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, int] | None,
                bias: bool = True) -> Linear:
    """(weight, bias) of `name`.weight / `name`.bias (shape unchecked where None); the bias optional
    unless `bias`."""
    w = take(tensors, name + ".weight", shape)
    assert w is not None
    return w, take(tensors, name + ".bias", (int(w.shape[0]),), required=bias)


def mlp(x: torch.Tensor, up: Linear, gate: Linear | None, down: Linear, act: Activation) -> torch.Tensor:
    """down(act(gate(x)) * up(x)) with a gate, down(act(up(x))) without (clip.cpp build_ffn)."""
    u = linear(x, *up)
    h = act(linear(x, *gate)) * u if gate is not None else act(u)
    return linear(h, *down)


def merger(x: torch.Tensor, fc1: Linear, fc2: Linear, act: Activation) -> torch.Tensor:
    """[n, D] in merge order -> [n / 4, out]: 4 consecutive rows concatenated, fc1, GELU, fc2."""
    return linear(act(linear(x.reshape(x.shape[0] // 4, -1), *fc1)), *fc2)
