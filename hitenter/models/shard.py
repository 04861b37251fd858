"""Tensor-parallel sharding of a decoder layer: the group protocol, which heads / rows a rank holds, and
the row-parallel projections (o_proj, down).

Built with a `TensorParallel` group (hitenter/distributed/group.py implements it), each layer takes its
shard of the full tensors at load. Q/K/V and gate/up are column-parallel: a rank holds whole output rows
(its heads, its FFN rows), GGUF block rows as the file stores them. `tp_shard` says how heads are split.
The row-parallel projections (`row_parallel`) return the whole output on every rank, by weight format:

* GGUF blocks (`GatheredBlockLinear`): each rank holds its share of the *output* rows, every input
  column (whole block rows again: no block is cut, whatever the block size or the dimensions); the
  ranks' inputs (their heads' attention outputs, their FFN activations) are all-gathered first and the
  ranks' output columns all-gathered after. Each output element is then the one dot product TP=1
  computes, by the same kernel on the same 8-bit activation blocks (the native kernels give a row of W
  the same bits whatever other rows are in the call: tests/distributed/test_tensor_parallel.py checks it), so the
  sharded model computes TP=1's bits. Why not split the input columns at block boundaries and all-reduce
  the partial sums: that changes the dot product's summation order (a sum of per-rank partial sums is
  not the kernel's one accumulation), so it cannot give TP=1's bits; the gather costs two all-gathers
  (inputs, outputs) where the all-reduce costs one reduce-scatter + all-gather.
* Dense fp32 / bf16 (`AllReduceLinear`): the classic split of the input columns and one all-reduce of
  the partial sums (the bias added once, after it): float rounding away from TP=1, not its bits.

Without a group (tp=None) the model is exactly the single-process one.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from hitenter.config import ModelConfig
from hitenter.kernels import BlockWeight
from hitenter.models.block_linear import BlockLinear
from hitenter.models.linear import Linear

ALIGN = 16   # FFN and hidden rows are dealt out in multiples of this (the fused layer's vector width)


class TensorParallel(Protocol):
    """This process's place in a tensor-parallel group (implemented by hitenter.distributed.group)."""

    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...            # sum over ranks (in place)
    def gather_cols(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor: ...  # [T, c_r] -> [T, sum c]
    def vocab_shard(self, weight: Any, dtype: torch.dtype) -> Any: ...    # this rank's vocab rows
    def vocab_embedding(self, weight: Any, dtype: torch.dtype) -> nn.Module: ...
    def gather_logits(self, local: torch.Tensor) -> torch.Tensor: ...     # [N, V/size] -> [N, V]


def split(n: int, rank: int, size: int, align: int = 1) -> tuple[int, int]:
    """(start, count) of rank's part of n items split as evenly as possible in units of `align` (when
    align divides n; else of 1): the first ranks get one unit more."""
    unit = align if n % align == 0 else 1
    base, extra = divmod(n // unit, size)
    return (rank * base + min(rank, extra)) * unit, (base + (rank < extra)) * unit


def rank_shard(cfg: ModelConfig, rank: int, size: int) -> tuple[int, int, int, int, int, int]:
    """`tp_shard` for rank `rank` of `size`."""
    f0, f = split(cfg.intermediate_size, rank, size, ALIGN)
    g = cfg.num_heads // cfg.num_kv_heads
    if cfg.num_kv_heads >= size:
        kv0, kvh = split(cfg.num_kv_heads, rank, size)
        return kv0 * g, kvh * g, kv0, kvh, f0, f
    nh = cfg.num_heads // size
    return rank * nh, nh, rank * cfg.num_kv_heads // size, 1, f0, f


def tp_shard(cfg: ModelConfig, tp: TensorParallel | None) -> tuple[int, int, int, int, int, int]:
    """(first Q head, Q heads, first KV head, KV heads, first FFN row, FFN rows) held by this rank.

    Whole GQA groups go to a rank: KV heads are split across ranks (unevenly when they do not divide,
    e.g. SmolLM2's 3 KV heads over 2 ranks: 2 + 1, with their 6 + 3 query heads), or, with more ranks
    than KV heads, each KV head is replicated on size / kv_heads ranks that split its query heads (vLLM).
    FFN rows in multiples of 16 where the width allows. tp None: everything."""
    if tp is None:
        return 0, cfg.num_heads, 0, cfg.num_kv_heads, 0, cfg.intermediate_size
    return rank_shard(cfg, tp.rank, tp.size)


class GatheredBlockLinear(BlockLinear):
    """A row-parallel projection over GGUF blocks (see the module doc): this rank's output rows of W with
    every input column; forward takes this rank's input columns `[T, in_counts[rank]]` and returns the
    whole `[T, sum(out_counts)]`, the same bits on every rank and as TP=1."""

    def __init__(self, parts: list[BlockWeight], bias: torch.Tensor | None, tp: TensorParallel,
                 in_counts: list[int], out_counts: list[int]) -> None:
        super().__init__(parts, bias)
        self.tp, self.in_counts, self.out_counts = tp, list(in_counts), list(out_counts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = self.tp.gather_cols(x.float(), self.in_counts)
        return self.tp.gather_cols(super().forward(full), self.out_counts)


class AllReduceLinear(nn.Module):
    """A row-parallel dense projection: this rank's input columns of W, the partial sums all-reduced,
    then the bias (once)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                 tp: TensorParallel) -> None:
        super().__init__()
        self.linear = Linear(weight, None, dtype)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype).contiguous(), requires_grad=False)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(self.linear(x))
        return y if self.bias is None else y + self.bias


def row_parallel(weight: Any, bias: torch.Tensor | None, dtype: torch.dtype, tp: TensorParallel,
                 in_counts: list[int]) -> nn.Module:
    """The row-parallel projection of the full `weight` `[N, K]` for this rank, whose input is its
    `in_counts[rank]` columns of K (the ranks' columns in rank order): GatheredBlockLinear over GGUF
    blocks, AllReduceLinear over a dense tensor (see the module doc)."""
    start = sum(in_counts[:tp.rank])
    if isinstance(weight, BlockWeight):
        spans = [split(weight.shape[0], r, tp.size, ALIGN) for r in range(tp.size)]
        r0, n = spans[tp.rank]
        b = None if bias is None else bias.narrow(0, r0, n)
        return GatheredBlockLinear([weight.narrow(0, r0, n)], b, tp, in_counts, [c for _, c in spans])
    if not isinstance(weight, torch.Tensor):
        raise ValueError("tensor parallelism: row-parallel weights must be GGUF blocks or dense tensors")
    return AllReduceLinear(weight.narrow(1, start, in_counts[tp.rank]), bias, dtype, tp)
