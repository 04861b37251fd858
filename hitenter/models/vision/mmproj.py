"""Reading a llama.cpp mmproj GGUF (the projector file beside a text model): its `clip.*` metadata as an
MmprojConfig and its tensors by llama.cpp's names (tools/mtmd/clip-impl.h: v.patch_embd, v.position_embd,
v.blk.N.{ln1,attn_q,attn_k,attn_v,attn_out,ln2,ffn_up,ffn_down}, v.post_ln, mm.*). Projectors: gemma3, and the
Qwen-VL mergers qwen2vl_merger, qwen2.5vl_merger (clip.vision.n_wa_pattern: every n-th layer attends fully,
the others by windows) and qwen3vl_merger (DeepStack features from the v.deepstack.N.* layers), and pixtral
(Pixtral / Mistral Small 3.1 / Ministral 3: 2D RoPE, optional patch merger, [IMG_BREAK] rows), and gemma4v
(Gemma 4: sandwich RMSNorm layers, v.blk.N.{attn_q_norm,attn_k_norm,attn_post_norm,ffn_post_norm,out_scale},
a [2, positions, D] position table, pooling by clip.vision.projector.scale_factor, default 3).

Contract: read_mmproj(path) -> (MmprojConfig, {name: fp32 tensor in torch order}); a file that is not a
vision mmproj, names a projector this package does not run, or lacks a needed key or tensor is a
ModelLoadError naming the file and the problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hitenter.errors import ModelLoadError
from hitenter.models.gguf import load_tensors, open_gguf, read_gguf_metadata

SUPPORTED_PROJECTORS: tuple[str, ...] = ("gemma3", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "pixtral",
                                         "gemma4v")
QWEN_PROJECTORS: tuple[str, ...] = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
GEMMA3_DEFAULT_MERGE = 4   # clip.cpp: patches per side pooled by 4 unless the file says otherwise
QWEN_DEFAULT_MERGE = 2     # clip.cpp: Qwen-VL merges 2 x 2 patches unless clip.vision.spatial_merge_size says
GEMMA4_DEFAULT_MERGE = 3   # clip.cpp: Gemma 4 pools 3 x 3 patches unless clip.vision.projector.scale_factor says
# clip.cpp set_limit_image_tokens for the dynamic-size projectors: (min, max) tokens of patch x merge pixels
TOKEN_LIMITS = {**dict.fromkeys(QWEN_PROJECTORS, (8, 4096)), "pixtral": (8, 1024), "gemma4v": (70, 1120)}


@dataclass(frozen=True)
class MmprojConfig:
    """The vision tower's shape and preprocessing as the file states them (llama.cpp's clip_hparams)."""
    projector: str
    image_size: int
    patch_size: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    eps: float
    projection_dim: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    merge: int
    activation: str   # "gelu" (tanh form), "gelu_quick" or "silu"
    n_wa_pattern: int = 0   # qwen2.5vl_merger: layer i attends fully where (i + 1) % n == 0, else by windows

    @property
    def dynamic_size(self) -> bool:
        """Whether images keep their aspect at a size of their own (Qwen-VL) instead of image_size^2."""
        return self.projector in TOKEN_LIMITS

    @property
    def pixel_limits(self) -> tuple[int, int]:
        """(min, max) pixels of a dynamic-size image after resizing (clip.cpp set_limit_image_tokens)."""
        area = (self.patch_size * self.merge) ** 2
        lo, hi = TOKEN_LIMITS[self.projector]
        return lo * area, hi * area

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_image(self) -> int:
        return (self.patches_per_side // self.merge) ** 2


def _need(meta: dict[str, Any], key: str, path: Path) -> Any:
    if key not in meta:
        raise ModelLoadError(f"{path}: the mmproj file lacks the metadata key {key!r}")
    return meta[key]


def _activation(meta: dict[str, Any], path: Path) -> str:
    gelu, silu = bool(meta.get("clip.use_gelu", False)), bool(meta.get("clip.use_silu", False))
    if gelu and silu:
        raise ModelLoadError(f"{path}: clip.use_gelu and clip.use_silu are both set")
    return "gelu" if gelu else "silu" if silu else "gelu_quick"


def _merge(meta: dict[str, Any], projector: str) -> int:
    if projector in QWEN_PROJECTORS:
        return int(meta.get("clip.vision.spatial_merge_size", QWEN_DEFAULT_MERGE))
    if projector == "pixtral":   # Pixtral 12B merges nothing; Mistral Small 3.1 / Ministral 3 say 2
        return int(meta.get("clip.vision.spatial_merge_size", 1))
    default = GEMMA4_DEFAULT_MERGE if projector == "gemma4v" else GEMMA3_DEFAULT_MERGE
    return int(meta.get("clip.vision.projector.scale_factor", default))


def _triple(meta: dict[str, Any], key: str, path: Path) -> tuple[float, float, float]:
    v = _need(meta, key, path)
    if not isinstance(v, list) or len(v) < 3:
        raise ModelLoadError(f"{path}: {key} must hold 3 numbers")
    return (float(v[0]), float(v[1]), float(v[2]))


def mmproj_config(meta: dict[str, Any], path: Path) -> MmprojConfig:
    """The MmprojConfig of a file's metadata; refuses audio-only files and projectors outside
    SUPPORTED_PROJECTORS."""
    if not meta.get("clip.has_vision_encoder", False):
        raise ModelLoadError(f"{path}: the mmproj file has no vision encoder (clip.has_vision_encoder)")
    projector = str(meta.get("clip.vision.projector_type") or _need(meta, "clip.projector_type", path))
    if projector not in SUPPORTED_PROJECTORS:
        raise ModelLoadError(f"{path}: the vision projector {projector!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_PROJECTORS)})")
    cfg = MmprojConfig(
        projector=projector,
        image_size=int(_need(meta, "clip.vision.image_size", path)),
        patch_size=int(_need(meta, "clip.vision.patch_size", path)),
        hidden=int(_need(meta, "clip.vision.embedding_length", path)),
        ffn=int(_need(meta, "clip.vision.feed_forward_length", path)),
        layers=int(_need(meta, "clip.vision.block_count", path)),
        heads=int(_need(meta, "clip.vision.attention.head_count", path)),
        eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
        projection_dim=int(_need(meta, "clip.vision.projection_dim", path)),
        image_mean=_triple(meta, "clip.vision.image_mean", path),
        image_std=_triple(meta, "clip.vision.image_std", path),
        merge=_merge(meta, projector),
        activation=_activation(meta, path),
        n_wa_pattern=int(meta.get("clip.vision.n_wa_pattern", 0)),
    )
    if projector == "qwen2.5vl_merger" and "clip.vision.n_wa_pattern" not in meta:
        raise ModelLoadError(f"{path}: a qwen2.5vl_merger file needs clip.vision.n_wa_pattern")
    if projector in QWEN_PROJECTORS and cfg.merge != 2:
        raise ModelLoadError(f"{path}: the Qwen-VL merger concatenates 2 x 2 patches; spatial_merge_size "
                             f"{cfg.merge} is not supported")
    _check_shape(cfg, path)
    return cfg


def _check_shape(cfg: MmprojConfig, path: Path) -> None:
    positive = {k: getattr(cfg, k) for k in ("image_size", "patch_size", "hidden", "ffn", "heads",
                                             "projection_dim", "merge")}
    bad = [k for k, v in positive.items() if v <= 0]
    if bad:
        raise ModelLoadError(f"{path}: mmproj values must be positive: {', '.join(bad)}")
    if cfg.n_wa_pattern < 0:
        raise ModelLoadError(f"{path}: clip.vision.n_wa_pattern must not be negative")
    if not cfg.dynamic_size and (cfg.image_size % cfg.patch_size or cfg.patches_per_side % cfg.merge):
        raise ModelLoadError(f"{path}: image_size {cfg.image_size} is not patch_size {cfg.patch_size} x a "
                             f"multiple of the merge factor {cfg.merge}")
    if cfg.hidden % cfg.heads:
        raise ModelLoadError(f"{path}: vision embedding_length {cfg.hidden} is not a multiple of head_count")
    if cfg.dynamic_size and (cfg.hidden // cfg.heads) % 4:
        raise ModelLoadError(f"{path}: the 2D vision RoPE needs a head size that is a multiple of 4")
    if cfg.image_size > 4096:
        raise ModelLoadError(f"{path}: vision image_size {cfg.image_size} is over 4096")
    if any(s == 0 for s in cfg.image_std):
        raise ModelLoadError(f"{path}: clip.vision.image_std holds a zero")


def read_mmproj(path: str | os.PathLike[str]) -> tuple[MmprojConfig, dict[str, torch.Tensor]]:
    """The config and fp32 tensors (torch order) of the mmproj file at `path`."""
    p = Path(path)
    reader = open_gguf(p)
    meta = read_gguf_metadata(reader)
    cfg = mmproj_config(meta, p)
    return cfg, load_tensors(reader)
