"""Image preprocessing as llama.cpp's mtmd does it (tools/mtmd/mtmd-image.cpp), on RGB uint8 pixels.

fixed_size (Gemma 3): the image scaled to fit image_size x image_size with its aspect ratio kept (the new
sides ceil(side x scale) in float32, scale = min(S / w, S / h)), resampled bilinearly by llama.cpp's port of
Pillow's resampler (resample.py), centred on a black square ((S - new) // 2 offsets); an image already S x S
is taken as is. Then value / 255, (value - mean) / std per channel, from the mmproj file.

dynamic_size (Qwen-VL, mtmd_image_preprocessor_dyn_size): the target sides are multiples of
align = patch x merge keeping the aspect ratio (transformers' smart_resize as clip.cpp's
calc_size_preserved_ratio computes it in float32: sides rounded to align, then scaled down by
sqrt(h w / max_pixels) and floored, or up by sqrt(min_pixels / (h w)) and ceiled, to keep the area within
the limits); the image is fitted into that size as above (bicubic, black centred pad), then normalized.

Contract: fixed_size_pixels(rgb [H, W, 3] uint8, size, mean, std) -> a [3, size, size] float32 tensor;
dynamic_size_pixels(rgb, align, min_pixels, max_pixels, mean, std) -> [3, H', W'] with H', W' multiples of
align.
"""

from __future__ import annotations

import numpy as np
import torch

from hitenter.models.vision.resample import resample as resample_image


def fit_size(width: int, height: int, size: int) -> tuple[int, int]:
    """llama.cpp's PAD_CEIL fit of a width x height image into size x size (float32 arithmetic)."""
    return fit_box(width, height, size, size)


def fit_box(width: int, height: int, box_w: int, box_h: int) -> tuple[int, int]:
    """llama.cpp's PAD_CEIL fit of a width x height image into box_w x box_h (float32 arithmetic)."""
    scale = min(np.float32(box_w) / np.float32(width), np.float32(box_h) / np.float32(height))
    new_w = min(int(np.ceil(np.float32(width) * scale)), box_w)
    new_h = min(int(np.ceil(np.float32(height) * scale)), box_h)
    return max(new_w, 1), max(new_h, 1)


def resize_padded(rgb: np.ndarray, size: int, resample: str = "bilinear", height_out: int | None = None) -> np.ndarray:
    """`rgb` fitted into a black size x size square, or size x height_out box (see the module docstring);
    [box height, box width, 3] uint8."""
    box_w, box_h = size, size if height_out is None else height_out
    height, width = rgb.shape[:2]
    if (width, height) == (box_w, box_h):
        return rgb
    new_w, new_h = fit_box(width, height, box_w, box_h)
    scaled = resample_image(rgb, new_w, new_h, resample)
    out = np.zeros((box_h, box_w, 3), dtype=np.uint8)
    x0, y0 = (box_w - new_w) // 2, (box_h - new_h) // 2
    out[y0:y0 + new_h, x0:x0 + new_w] = scaled
    return out


def smart_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """clip.cpp calc_size_preserved_ratio: (width, height) multiples of `align`, aspect kept, area within
    [min_pixels, max_pixels] (float32 arithmetic, C rounding: halves away from zero)."""
    f32, a = np.float32, np.float32(align)

    def by(x: np.float32, op: str) -> int:
        q = f32(f32(x) / a)
        r = np.floor(q + f32(0.5)) if op == "round" else np.ceil(q) if op == "ceil" else np.floor(q)
        return int(r) * align

    w_bar, h_bar = max(align, by(f32(width), "round")), max(align, by(f32(height), "round"))
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(f32(height) * f32(width)) / f32(max_pixels), dtype=np.float32)
        h_bar = max(align, by(f32(f32(height) / beta), "floor"))
        w_bar = max(align, by(f32(f32(width) / beta), "floor"))
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / f32(f32(height) * f32(width)), dtype=np.float32)
        h_bar = by(f32(f32(height) * beta), "ceil")
        w_bar = by(f32(f32(width) * beta), "ceil")
    return w_bar, h_bar


def normalize(rgb: np.ndarray, mean: tuple[float, float, float], std: tuple[float, float, float]) -> torch.Tensor:
    """[H, W, 3] uint8 -> [3, H, W] float32: value / 255, then (value - mean) / std per channel."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


def fixed_size_pixels(rgb: np.ndarray, size: int, mean: tuple[float, float, float],
                      std: tuple[float, float, float], resample: str = "bilinear") -> torch.Tensor:
    """The encoder input of one image for a fixed-size family (Gemma 3): [3, size, size] float32."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected [H, W, 3] uint8 pixels, got {rgb.dtype} {tuple(rgb.shape)}")
    return normalize(resize_padded(rgb, size, resample), mean, std)


def dynamic_size_pixels(rgb: np.ndarray, align: int, min_pixels: int, max_pixels: int,
                        mean: tuple[float, float, float], std: tuple[float, float, float],
                        resample: str = "bicubic") -> torch.Tensor:
    """The encoder input of one image for a dynamic-size family (Qwen-VL): [3, H', W'] float32, H' and W'
    multiples of `align` (see the module docstring)."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected [H, W, 3] uint8 pixels, got {rgb.dtype} {tuple(rgb.shape)}")
    w, h = smart_size(rgb.shape[1], rgb.shape[0], align, min_pixels, max_pixels)
    return normalize(resize_padded(rgb, w, resample, height_out=h), mean, std)
