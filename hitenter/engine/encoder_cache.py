"""The vision encoder's outputs, kept by image content key: an image is encoded once, then served from here
to every step, request and preemption that needs its rows, until evicted.

Contract: ``rows(run)`` -> the encoder's rows for an ImageRun ([run.length, hidden] float32), encoding it
only when its key is not held; a bounded LRU of ``capacity`` images. ``runs`` counts encoder calls,
``hits`` lookups served without one (the measure that a repeated image skips the encoder). ``seconds``
sums the encoder's time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import torch

from hitenter.request import ImageRun

DEFAULT_CAPACITY = 32


class EncoderCache:
    def __init__(self, encoder: Any, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        self.encoder = encoder
        self.capacity = capacity
        self._rows: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.runs = 0
        self.hits = 0
        self.seconds = 0.0

    def __contains__(self, key: bytes) -> bool:
        return key in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self, run: ImageRun) -> torch.Tensor:
        got = self._rows.get(run.key)
        if got is not None:
            self._rows.move_to_end(run.key)
            self.hits += 1
            return got
        t0 = time.perf_counter()
        out = self.encoder.encode(run.pixels).float()
        self.seconds += time.perf_counter() - t0
        self.runs += 1
        if tuple(out.shape[:1]) != (run.length,):
            raise ValueError(f"the vision encoder gave {out.shape[0]} rows for an image of {run.length} tokens")
        self._rows[run.key] = out
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
        return out
