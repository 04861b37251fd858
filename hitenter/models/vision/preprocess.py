"""Image preprocessing as llama.cpp's mtmd does it (tools/mtmd/mtmd-image.cpp), on RGB uint8 pixels.

fixed_size (Gemma 3): the image scaled to fit image_size x image_size with its aspect ratio kept (the new
sides ceil(side x scale) in float32, scale = min(S / w, S / h)), resampled bilinearly by llama.cpp's port of
Pillow's resampler (resample.py), centred on a black square ((S - new) // 2 offsets); an image already S x S
is taken as is. Then value / 255, (value - mean) / std per channel, from the mmproj file.

Contract: fixed_size_pixels(rgb [H, W, 3] uint8, size, mean, std) -> a [3, size, size] float32 tensor.
"""

from __future__ import annotations

import numpy as np
import torch

from hitenter.models.vision.resample import resample as resample_image


def fit_size(width: int, height: int, size: int) -> tuple[int, int]:
    """llama.cpp's PAD_CEIL fit of a width x height image into size x size (float32 arithmetic)."""
    s = np.float32(size)
    scale = min(s / np.float32(width), s / np.float32(height))
    new_w = min(int(np.ceil(np.float32(width) * scale)), size)
    new_h = min(int(np.ceil(np.float32(height) * scale)), size)
    return max(new_w, 1), max(new_h, 1)


def resize_padded(rgb: np.ndarray, size: int, resample: str = "bilinear") -> np.ndarray:
    """`rgb` fitted into a black size x size square (see the module docstring); [size, size, 3] uint8."""
    height, width = rgb.shape[:2]
    if (width, height) == (size, size):
        return rgb
    new_w, new_h = fit_size(width, height, size)
    scaled = resample_image(rgb, new_w, new_h, resample)
    out = np.zeros((size, size, 3), dtype=np.uint8)
    x0, y0 = (size - new_w) // 2, (size - new_h) // 2
    out[y0:y0 + new_h, x0:x0 + new_w] = scaled
    return out


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
