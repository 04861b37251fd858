"""Tensor-parallel sharding of a Llama / Qwen2 layer: the group protocol and which heads / rows a rank holds.

Built with a `TensorParallel` group (hitenter/distributed/group.py implements it), each layer takes its
shard of the full tensors at load (Q/K/V and gate/up column-parallel, o_proj and down row-parallel, one
all-reduce each); `tp_shard` says how heads are split. Without one (tp=None) the model is exactly the
single-process one.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from hitenter.config import ModelConfig


class TensorParallel(Protocol):
    """This process's place in a tensor-parallel group (implemented by hitenter.distributed.group)."""

    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...            # sum over ranks (in place)
    def vocab_shard(self, weight: torch.Tensor, dtype: torch.dtype) -> nn.Parameter: ...
    def vocab_embedding(self, weight: torch.Tensor, dtype: torch.dtype) -> nn.Module: ...
    def gather_logits(self, local: torch.Tensor) -> torch.Tensor: ...     # [N, V/size] -> [N, V]


def _split(n: int, rank: int, size: int) -> tuple[int, int]:
    """(start, count) of rank's part of n items split as evenly as possible (the first n % size get one more)."""
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def tp_shard(cfg: ModelConfig, tp: TensorParallel | None) -> tuple[int, int, int, int, int, int]:
    """(first Q head, Q heads, first KV head, KV heads, first FFN row, FFN rows) held by this rank.

    Whole GQA groups go to a rank: KV heads are split across ranks (unevenly when they do not divide,
    e.g. SmolLM2's 3 KV heads over 2 ranks: 2 + 1, with their 6 + 3 query heads), or, with more ranks
    than KV heads, each KV head is replicated on size / kv_heads ranks that split its query heads (vLLM).
    tp None: everything."""
    if tp is None:
        return 0, cfg.num_heads, 0, cfg.num_kv_heads, 0, cfg.intermediate_size
    f0, f = _split(cfg.intermediate_size, tp.rank, tp.size)
    g = cfg.num_heads // cfg.num_kv_heads
    if cfg.num_kv_heads >= tp.size:
        kv0, kvh = _split(cfg.num_kv_heads, tp.rank, tp.size)
        return kv0 * g, kvh * g, kv0, kvh, f0, f
    nh = cfg.num_heads // tp.size
    return tp.rank * nh, nh, tp.rank * cfg.num_kv_heads // tp.size, 1, f0, f
