"""Activations that the kernels' 8-bit activation rounding represents exactly, so a kernel's error against
an fp64 product is its own arithmetic's alone."""

from __future__ import annotations

import numpy as np
import torch


def exact_activations(m: int, k: int, seed: int) -> torch.Tensor:
    """x = 2^e * integers in [-127, 127], each 32-block holding a 127, e per 256 (or per row): quantized exactly."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, size=(m, k // 32, 32))
    q[:, :, 0] = 127
    groups = k // 256 if k % 256 == 0 else 1
    scale = 2.0 ** rng.integers(-8, 3, size=(m, groups, 1))
    return torch.from_numpy((q.reshape(m, groups, -1) * scale).reshape(m, k).astype(np.float32))
