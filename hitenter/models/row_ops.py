"""Elementwise ops on narrow rows with each row's bits independent of the row count.

torch's CPU kernels flatten a contiguous tensor and run a transcendental op (exp, sigmoid, softplus, silu)
two SIMD vectors at a time, then the remainder element by element with the scalar function, whose bits can
differ. On a narrow ``[T, w]`` tensor (a gate per head, one per row) whether an element lands in the
vector loop or in the scalar tail depends on T, so the same row could round differently alone and in a
batch (a shared expert's sigmoid gate, [40, 1] against [16, 1], does). `rowwise` pads each row to a
multiple of LANES columns (a multiple of two vectors of every ISA torch builds: 2 x 16 fp32 lanes on
AVX-512), so every element takes the vector loop at the same lane whatever T.

Limit: torch also splits a tensor of more than its grain (32,768 elements) among threads, at
ceil(numel / threads) elements, and each thread's share ends in its own scalar tail. With a thread count
whose shares are not whole multiples of two vectors (5 or 7 threads on [n, 6144] rows do this; 1, 2, 3, 4
and 8 do not), large tensors can still round a row differently at different T, here and in every other
elementwise op of the models.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LANES = 64


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for an elementwise ``fn`` on ``x [T, ...]``, each row computed as a padded row of a
    multiple of LANES elements (see the module docstring); contiguous rows already that wide go as they are."""
    t, w = x.shape[0], x[0].numel() if x.shape[0] else 0
    if w % LANES == 0 and x.is_contiguous():
        return fn(x)
    buf = x.new_zeros(t, -(-w // LANES) * LANES)
    buf[:, :w] = x.reshape(t, w)
    return fn(buf)[:, :w].reshape(x.shape)
