"""What every recurrent mixer shares: its state tensors (`StateCache`), its contract (`RecurrentMixer`) and
the walk over a step's sequences that reads and writes their slots (`for_each_span`).

State layout: a mixer names its state tensors and their per-slot shapes (`state_shapes`); the engine
allocates each as ``[num_slots, *shape]`` float32 (kv_cache/state_group.py decides which slot is whose).
A step's metadata (models/attention.py AttentionMetadata) gives each sequence its live slot
(``state_slots``) and the saves to take (``state_saves``: after ``r`` of sequence i's rows, copy its state
into slot ``dst``); the runner has already restored or zeroed the live slots before the forward.

Batch invariance: a mixer computes each sequence's recurrence on its own rows only, in token order, with
the same ops whatever else is in the batch and however the prompt was cut into steps, so a row's bits
depend only on its sequence's tokens (and on its prompt length, where a mixer takes a different path for
prompt and generation rows).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import nn


class StateCache:
    """One recurrent layer's state tensors, ``[num_slots, *shape]`` each (float32, untouched until used)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots: must be >= 1, got {num_slots}")
        self.tensors = {name: torch.empty((num_slots, *shape), dtype=torch.float32) for name, shape in shapes.items()}
        self.num_slots = num_slots

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def copy(self, src: int, dst: int) -> None:
        """Slot ``dst`` becomes a copy of slot ``src``."""
        for t in self.tensors.values():
            t[dst].copy_(t[src])

    def zero(self, slot: int) -> None:
        for t in self.tensors.values():
            t[slot].zero_()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @staticmethod
    def bytes_per_slot(shapes: dict[str, tuple[int, ...]]) -> int:
        return sum(4 * int(torch.Size(s).numel()) for s in shapes.values())


Span = Callable[[int, int, int], None]   # (first row, end row, slot): run the recurrence on rows [a, b)


def for_each_span(attn: Any, cache: StateCache, run: Span, skip: Collection[int] = ()) -> None:
    """Call ``run(a, b, slot)`` for each sequence of the step, in order, its rows cut where a save is due; after
    the span that ends at a save, copy the live slot into the save's slot. Padding rows (past the last
    sequence's rows) are never passed, nor the sequences in ``skip`` (indices a mixer handles itself, e.g.
    the `single_rows` it updates in one batched call)."""
    saves: dict[int, list[tuple[int, int]]] = {}
    for seq, rows, dst in attn.state_saves or ():
        saves.setdefault(seq, []).append((rows, dst))
    qsl = attn.query_start_loc
    for i, slot in enumerate(attn.state_slots):
        if i in skip:
            continue
        a, b = qsl[i], qsl[i + 1]
        start = a
        for rows, dst in sorted(saves.get(i, ())):
            if a + rows > start:
                run(start, a + rows, slot)
                start = a + rows
            cache.copy(slot, dst)
        if b > start:
            run(start, b, slot)


def single_rows(attn: Any) -> list[int]:
    """The sequences of the step with exactly one row and no save due (generation rows): a mixer may update
    them together, one row each, as long as each row gets the arithmetic its one-row span would."""
    saved = {seq for seq, _, _ in attn.state_saves or ()}
    qsl = attn.query_start_loc
    return [i for i in range(len(attn.state_slots)) if qsl[i + 1] - qsl[i] == 1 and i not in saved]


class RecurrentMixer(nn.Module):
    """A recurrent token mixer. Subclasses build their weights from ``(cfg, w, prefix, dtype)`` (the loader's
    tensors under llama.cpp's names, ``prefix`` = ``"blk.{i}."``) and implement:

    - ``state_shapes() -> {name: per-slot shape}``;
    - ``forward(h [T, H] normed rows, attn, cache) -> [T, H]``: the mixer's output for every row (rows past
      ``attn.query_start_loc[-1]`` are padding: any finite value), reading and updating the slots of
      ``attn.state_slots`` through ``for_each_span``. Projections may run on all rows at once (they are
      row-wise); the recurrence runs per span."""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def forward(self, h: torch.Tensor, attn: Any, cache: StateCache) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError
