"""The draft model's LM head over the first ``num_ids`` vocabulary ids only.

Why: a small draft's head is a large share of its decode step (Qwen2.5-Coder-0.5B: a 151,936 x 896 Q8_0
head, 145 of the ~390 MB a step reads). Drafts only need to be good guesses: verification keeps exactly
the target's tokens whatever the draft proposes, so the draft may score a subset of the vocabulary.
Byte-level BPE vocabularies are ordered by merge rank (roughly by frequency), so a prefix of the ids
keeps the common tokens, and for GGUF blocks it is a zero-copy view of the head's first rows.

The logits come back full width (``-inf`` past ``num_ids``) so the request's logits processors see the
ids they expect, and a sampled draft's probabilities are 0 there (a valid ``q`` for rejection sampling).
Anything else (a dense head, a biased or sharded head) keeps the model's own ``compute_logits``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hitenter import envs
from hitenter.kernels.blocks import BLOCK_TYPES, REPACK_ROW_BYTES, BlockWeight
from hitenter.models.block_linear import BlockLinear


def draft_vocab_size() -> int:
    """Ids the draft's head scores: HITENTER_DRAFT_VOCAB (0: all of them)."""
    return envs.HITENTER_DRAFT_VOCAB.get()


def first_rows(w: BlockWeight, n: int) -> BlockWeight | None:
    """The first n rows of w as a view (None where a repacked layout does not split there)."""
    if not w.lanes:
        return w.narrow(0, 0, n)
    if n % w.lanes or w.qtype not in REPACK_ROW_BYTES:
        return None
    per_row = (w.shape[1] // BLOCK_TYPES[w.qtype][0]) * REPACK_ROW_BYTES[w.qtype]   # groups of lanes rows
    return BlockWeight(w.data.narrow(0, 0, n * per_row), w.qtype, (n, w.shape[1]), w.lanes)


class TrimmedHead:
    """hidden [N, H] -> logits [N, V]: the model's head on ids [0, num_ids), -inf beyond."""

    def __init__(self, model: torch.nn.Module, num_ids: int) -> None:
        head, cfg = model.head, model.config
        if not isinstance(head, BlockLinear) or len(head.parts) != 1 or head.bias is not None:
            raise ValueError("TrimmedHead: needs a one-part GGUF block head without bias")
        w = head.parts[0]
        rows = first_rows(w, num_ids) if 0 < num_ids < w.shape[0] else None   # a small vocabulary: all of it
        if rows is None:
            raise ValueError(f"TrimmedHead: cannot keep {num_ids} of the head's {w.shape[0]} rows")
        self.linear = BlockLinear([rows])
        self.num_ids, self.vocab_size = num_ids, w.shape[0]
        self.logit_scale, self.softcap = cfg.logit_scale, cfg.final_logit_softcap

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.linear(hidden.float())
        if self.logit_scale != 1.0:
            x = x * self.logit_scale
        if self.softcap > 0:
            x = torch.tanh(x / self.softcap) * self.softcap
        out = x.new_full((x.shape[0], self.vocab_size), float("-inf"))
        out[:, :self.num_ids] = x
        return out


def draft_logits(model: torch.nn.Module, num_ids: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A TrimmedHead for the draft where it applies (0 < num_ids < vocab, a block head, no tensor
    parallelism), else None (the model's own compute_logits)."""
    if num_ids <= 0 or getattr(model, "tp", None) is not None:
        return None
    try:
        return TrimmedHead(model, num_ids)
    except (ValueError, AttributeError):
        return None
