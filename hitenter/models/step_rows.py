"""What the attention kernel wrappers (decode_kernel.py, prompt_kernel.py) read of a step's attention
metadata: the part of attention.AttentionMetadata they depend on, so they need not import attention.py
(which imports them)."""

from __future__ import annotations

from typing import Protocol


class StepRows(Protocol):
    """A step's sequences: their new rows in the flat batch and their block tables."""

    query_start_loc: list[int]      # S+1 offsets of each sequence's new rows
    seq_lens: list[int]             # S context lengths after the step

    def gemm_rows(self, i: int, use_kernel: bool) -> int:
        """How many of sequence i's new rows (the first ones) take the GEMM path."""
        ...

    def table(self, i: int) -> list[int]:
        """Sequence i's block table (ValueError if it does not cover its context)."""
        ...
