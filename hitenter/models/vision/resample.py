"""llama.cpp's image resampler (tools/mtmd/mtmd-image.cpp resize_pillow), in numpy, bit for bit.

It is Pillow's separable convolution resampler (Resample.c: filter support widened by the scale when
shrinking, weights normalized then rounded to 22-bit fixed point, uint8 rounding between passes), with one
difference that matters: llama.cpp always runs the horizontal pass first, where Pillow (>= 10) picks the
cheaper order, so Pillow's output can differ by 1 in some bytes. The reference being llama.cpp, this module
copies its order.

Contract: resample(rgb [H, W, 3] uint8, width, height, "bilinear" | "bicubic") -> [height, width, 3] uint8.
"""

from __future__ import annotations

import math

import numpy as np

PRECISION_BITS = 32 - 8 - 2
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}


def _filter(kind: str, x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    if kind == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _weights(in_size: int, out_size: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Per output index: the input indices [out, k] (clamped) and fixed-point weights [out, k] (0 past the
    window), as Resample.c's precompute_coeffs + normalize_coeffs_8bpc."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT[kind] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    w = _filter(kind, (taps[None, :] + xmin[:, None] - center[:, None] + 0.5) / filterscale)
    w = np.where(taps[None, :] < xmax[:, None], w, 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=w.copy(), where=total != 0.0)
    fixed = np.trunc(w * float(1 << PRECISION_BITS) + np.where(w < 0, -0.5, 0.5)).astype(np.int64)
    idx = np.minimum(xmin[:, None] + taps[None, :], in_size - 1)
    return idx, fixed


def _pass(src: np.ndarray, out_size: int, kind: str) -> np.ndarray:
    """Resample axis 1 of [rows, in, 3] uint8 to out_size."""
    idx, w = _weights(src.shape[1], out_size, kind)
    acc = np.full((src.shape[0], out_size, src.shape[2]), 1 << (PRECISION_BITS - 1), dtype=np.int64)
    for k in range(idx.shape[1]):
        acc += src[:, idx[:, k], :].astype(np.int64) * w[None, :, k, None]
    return np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)


def resample(rgb: np.ndarray, width: int, height: int, kind: str = "bilinear") -> np.ndarray:
    """`rgb` resampled to width x height (horizontal pass first, then vertical; see the module docstring)."""
    if kind not in SUPPORT:
        raise ValueError(f"unknown resampling filter {kind!r}")
    if not (0 < width <= 65536 and 0 < height <= 65536):
        raise ValueError(f"resize target {width}x{height} is out of range")
    out = rgb
    if width != rgb.shape[1]:
        out = _pass(out, width, kind)
    if height != rgb.shape[0]:
        out = _pass(out.transpose(1, 0, 2), height, kind).transpose(1, 0, 2)
    return np.ascontiguousarray(out)
