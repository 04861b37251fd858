"""A tensor-parallel group on torch.distributed: the collectives the sharded model needs.

`TPGroup` implements models/shard.py's `TensorParallel` protocol over the default process group
(gloo on CPU; the same calls run on NCCL for CUDA tensors): `gather_cols` around the row-parallel
projections over GGUF blocks (models/shard.py; inside the fused C layer through distributed/fused.py,
`fused_library` / `wire_fused`), `all_reduce` after the dense ones, a vocab-parallel embedding (each
rank holds `ceil(V / size)` rows: dense, zero-padded at the end; GGUF blocks, the file's rows, shared
with a tied head's shard; a rank looks up the ids it owns, writes zeros elsewhere, and the ranks
all-reduce: one row plus zeros, exact), and a vocab-parallel LM head whose `[N, V/size]` shards are
gathered to rank 0 (`gather_logits` returns the full `[N, V]` on rank 0 and the local shard elsewhere;
only rank 0 samples).

`broadcast_object` / `validate_tp` are the small helpers the runner and the workers share.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
from torch import distributed as dist
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.kernels import BlockWeight
from hitenter.models.block_linear import BlockEmbedding


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker failed, died or timed out; the engine cannot continue."""


def validate_tp(cfg: ModelConfig, size: int) -> None:
    """Raise ValueError naming the option when `size` ranks cannot shard this model.

    Whole GQA groups are dealt out (see models/shard.py `tp_shard`), so any size up to the KV head count
    works, evenly or not (uneven: the rank with more heads sets the pace). Beyond it, KV heads are
    replicated, which needs size to be a multiple of the KV heads and to divide the query heads (as vLLM)."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size: must be >= 1, got {size}")
    kvh, nh = cfg.num_kv_heads, cfg.num_heads
    if size > kvh and (size % kvh or nh % size):
        raise ValueError(f"tensor_parallel_size: {size} ranks cannot shard {cfg.name or cfg.architecture}'s "
                         f"{nh} attention heads / {kvh} KV heads; use at most {kvh} ranks, or a multiple of "
                         f"{kvh} that divides {nh}")


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + per_rank) of the (padded) embedding table; forward sums over ranks."""

    def __init__(self, weight: nn.Parameter, start: int, group: TPGroup) -> None:
        super().__init__()
        self.weight = weight
        self.start = start
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(torch.where(mine, local, 0), self.weight)
        x = x * mine.unsqueeze(-1).to(x.dtype)   # rows other ranks own: exact zeros
        return self.group.all_reduce(x)


class VocabParallelBlockEmbedding(nn.Module):
    """Rows [start, start + n) of a GGUF block embedding table (a BlockEmbedding over this rank's rows,
    the same bytes as a tied head's shard); forward sums over ranks (exact: one rank's row plus zeros)."""

    def __init__(self, weight: BlockWeight, start: int, group: TPGroup) -> None:
        super().__init__()
        self.table = BlockEmbedding(weight)
        self.start, self.rows = start, weight.shape[0]
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.rows)
        x = self.table(torch.where(mine, local, 0))
        x = x * mine.unsqueeze(-1).to(x.dtype)
        return self.group.all_reduce(x)


class TPGroup:
    """Rank `rank` of `size` in the default process group (see module doc)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.vocab_size = 0           # set by vocab_shard (the full table's row count)
        self.vocab_per_rank = 0
        self.comm_seconds = 0.0       # time spent in collectives (benchmarks)
        self.comm_calls = 0
        self.fused_lib: Any = None    # the fused decode layer's instance wired to this group (distributed/fused.py)
        self._fused: Any = None
        self._vocab_rows: dict[int, BlockWeight] = {}

    def _timed(self, fn: Any, *args: Any, **kw: Any) -> Any:
        import time

        t0 = time.perf_counter()
        r = fn(*args, **kw)
        self.comm_seconds += time.perf_counter() - t0
        self.comm_calls += 1
        return r

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        self._timed(dist.all_reduce, x)
        return x

    def gather_cols(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Every rank's `[T, counts[r]]` side by side in rank order: `[T, sum(counts)]` (all-gather; the
        narrower ranks' parts padded to the widest for the collective)."""
        width = max(counts)
        x = x.contiguous()
        if x.shape[1] < width:
            x = torch.cat([x, x.new_zeros(x.shape[0], width - x.shape[1])], dim=1)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._timed(dist.all_gather, parts, x)
        return torch.cat([p[:, :c] for p, c in zip(parts, counts, strict=True)], dim=1)

    def vocab_shard(self, weight: torch.Tensor | BlockWeight, dtype: torch.dtype) -> nn.Parameter | BlockWeight:
        """This rank's `ceil(V / size)` vocab rows: dense, zero-padded at the end; GGUF blocks, the file's
        rows (the last rank's may be fewer: its logits are padded instead), the same object for a table
        shared by the embedding and a tied head."""
        self.vocab_size = weight.shape[0]
        self.vocab_per_rank = per = -(-self.vocab_size // self.size)
        start = self.rank * per
        if isinstance(weight, BlockWeight):
            key = id(weight)
            if key not in self._vocab_rows:
                n = max(0, min(per, self.vocab_size - start))
                self._vocab_rows[key] = weight.narrow(0, min(start, self.vocab_size), n)
            return self._vocab_rows[key]
        rows = weight[start:start + per].to(dtype)
        if rows.shape[0] < per:   # the last rank's shard is zero-padded (its padded logits are dropped)
            rows = torch.cat([rows, rows.new_zeros(per - rows.shape[0], weight.shape[1])])
        return nn.Parameter(rows.contiguous(), requires_grad=False)

    def vocab_embedding(self, weight: torch.Tensor | BlockWeight, dtype: torch.dtype) -> nn.Module:
        shard = self.vocab_shard(weight, dtype)
        if isinstance(shard, BlockWeight):
            return VocabParallelBlockEmbedding(shard, self.rank * self.vocab_per_rank, self)
        return VocabParallelEmbedding(shard, self.rank * self.vocab_per_rank, self)

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        local = local.contiguous()
        if local.shape[1] < self.vocab_per_rank:   # a block head's last shard: fewer rows than the others
            local = torch.cat([local, local.new_zeros(local.shape[0], self.vocab_per_rank - local.shape[1])], 1)
        if self.rank != 0:
            self._timed(dist.gather, local, None, dst=0)
            return local
        parts = [torch.empty_like(local) for _ in range(self.size)]
        self._timed(dist.gather, local, parts, dst=0)
        return torch.cat(parts, dim=-1)[:, :self.vocab_size]


    def fused_library(self, base: Any) -> Any:
        """The fused decode layer's library for this group's layers (see distributed/fused.py), or None."""
        from hitenter.distributed.fused import FusedCollectives

        if self._fused is None or not self._fused.current(base):
            self._fused = FusedCollectives.create(base)
            self.fused_lib = None if self._fused is None else self._fused.lib
        return self.fused_lib

    def wire_fused(self, fused: Any, layer: nn.Module) -> None:
        """Point a fused layer's row-parallel projections at this group's collectives."""
        self._fused.wire(fused, layer)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src` sends `obj` (pickled) to every rank; each returns it. Two collectives (length, bytes)."""
    if dist.get_rank() == src:
        data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
        n = torch.tensor([data.numel()], dtype=torch.long)
        dist.broadcast(n, src)
        dist.broadcast(data, src)
        return obj
    n = torch.zeros(1, dtype=torch.long)
    dist.broadcast(n, src)
    data = torch.empty(int(n.item()), dtype=torch.uint8)
    dist.broadcast(data, src)
    return pickle.loads(data.numpy().tobytes())
