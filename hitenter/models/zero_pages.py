"""Zeroed tensors whose memory the OS commits as it is written (``zeros_on_demand``).

A tensor over a fresh anonymous mapping reads as zeros and holds no physical pages until a page is
first written; torch.zeros writes every byte at once. A KV cache sized for the whole budget but
filled a block at a time then costs resident memory for the blocks written so far only. The mapping
is unmapped when the last tensor viewing it is freed.
"""

from __future__ import annotations

import math
import mmap

import torch

SMALL = 1 << 20         # below this, torch.zeros: a mapping of its own is not worth it


def zeros_on_demand(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous zeroed CPU tensor of ``shape`` and ``dtype`` over its own anonymous mapping."""
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if nbytes < SMALL:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)          # anonymous, private: zero pages until written
    return torch.frombuffer(buf, dtype=dtype, count=count).view(shape)
