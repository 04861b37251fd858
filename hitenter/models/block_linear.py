"""Linear and embedding modules over GGUF block weights (hitenter/kernels), fp32 activations.

* `BlockLinear(parts, bias)`: y = [qmatmul(x, p) for p in parts] side by side along the output dim
  (each part writes its columns of one output), + bias. One part per run of a single block type: a fused projection whose pieces share a type is
  one `qmatmul` call over their concatenated rows; a Q4_K_M file that stores attn_v in Q6_K beside
  Q4_K attn_q/attn_k gets two calls (Q+K, then V) whose outputs are concatenated.
* `BlockEmbedding(w)`: token ids -> fp32 rows, dequantizing only the looked-up rows (gguf's reference
  dequantizer: exactly the file's values); no dense copy of the table exists. A tied LM head is a
  BlockLinear over the same BlockWeight: the bytes are shared, not copied.
* `fuse_rows(ws)`: the parts of a fused projection (consecutive same-type pieces concatenated).

Both modules register their block bytes as buffers, so `weight_bytes` (hitenter/quant) counts them,
once per storage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hitenter import kernels
from hitenter.kernels import BlockWeight, cat_block_rows, qmatmul
from hitenter.kernels.arena import WeightArena, trim_heap
from hitenter.kernels.qmatmul import repack, repack_lanes, repacked_nbytes

if TYPE_CHECKING:
    from hitenter.models.weight_cache import WeightCache


def fuse_rows(ws: list[BlockWeight]) -> list[BlockWeight]:
    """Consecutive weights of one block type concatenated (one copy each run); order kept."""
    runs: list[list[BlockWeight]] = []
    for w in ws:
        if runs and runs[-1][0].qtype == w.qtype:
            runs[-1].append(w)
        else:
            runs.append([w])
    return [r[0] if len(r) == 1 else cat_block_rows(r) for r in runs]


def own_block_bytes(model: nn.Module, cache: WeightCache | None = None) -> None:
    """Copy every BlockLinear weight into one WeightArena (huge pages where the OS has them, see
    hitenter/kernels/arena.py), with a BlockEmbedding that shares it (a tied head) pointed at the same
    copy, so the build's temporary copies (fused Q/K/V, gate/up) and the mapped pages are released.

    Why copy at all: a mapped GGUF's pages stay in this process's RSS beside the fused copies made from
    them, the file could change under a running server (a re-pull), and 4 KB pages slow a decode step
    (arena.py). With `cache` (hitenter/models/weight_cache.py) the arena is the cache file's map when it
    holds these slots (the model may then have been built over meta placeholders: nothing is copied),
    and otherwise is built here, written there and mapped back. Raises StaleWeightCache when a
    placeholder is left that the arena does not replace (the loader then builds from the file)."""
    linears = [m for m in model.modules() if isinstance(m, BlockLinear)]
    unique = {_key(p.data): p for m in linears for p in m.parts}
    # an embedding table not shared with a head is only ever read by rows: left on the map, it costs
    # resident memory for the rows looked up, not the whole table (Qwen2.5-1.5B: 125 MB)
    owners = linears + [m for m in model.modules() if isinstance(m, BlockEmbedding)
                        and _key(m.table.data) in unique]
    if not unique:
        return
    # every matmul weight of a repacked type (Q4_0, Q4_1, Q8_0) goes into the arena repacked
    # (kernels/csrc/qmatmul/qm_repack.h: no per-call unpacking, same size, same bits), a tied head's too: its
    # embedding then reads the rows it looks up out of the repacked groups (BlockWeight.file_rows)
    lanes = repack_lanes()
    slots = [_slot(w, lanes) for w in unique.values()]
    arena = cache.map(slots) if cache is not None else None
    if arena is None:
        if any(w.data.is_meta for w in unique.values()):
            raise StaleWeightCache("the cached weights do not match this build")
        arena = _fill(list(unique.values()), slots)
        stored = cache.store(arena, slots) if cache is not None else None
        arena = stored or arena
    arena.rewind()
    placed = {k: BlockWeight(arena.take(s[4]) if s[3] else arena.take(s[4]).view(w.shape[0], -1), w.qtype,
                             w.shape, s[3])
              for (k, w), s in zip(unique.items(), slots, strict=True)}

    def own(w: BlockWeight) -> BlockWeight:
        return placed[_key(w.data)]

    for m in owners:
        if isinstance(m, BlockLinear):
            m.set_parts([own(p) for p in m.parts])
        else:
            m.set_table(own(m.table))
    _replace_placeholders(model)
    model.__dict__["weight_arena"] = arena
    trim_heap()


class StaleWeightCache(RuntimeError):
    """The model was built over placeholders for a cached arena that does not hold its weights."""


def _key(t: torch.Tensor) -> int:
    """A weight's identity: its address (views of one copy are one weight), a placeholder's object id."""
    return id(t) if t.is_meta else t.data_ptr()


def _slot(w: BlockWeight, lanes: int) -> tuple[int, int, int, int, int]:
    """(type, rows, columns, repack lanes, bytes) of `w` in the arena."""
    n = repacked_nbytes(w)
    return (w.qtype, w.shape[0], w.shape[1], lanes if n else 0, n or w.data.numel())


def _fill(weights: list[BlockWeight], slots: list[tuple[int, int, int, int, int]]) -> WeightArena:
    """A fresh arena holding `weights` in order, repacked where their slot says so."""
    arena = WeightArena([s[4] for s in slots])
    for w, s in zip(weights, slots, strict=True):
        if s[3]:
            repack(w, arena.take(s[4]))
        else:
            arena.place(w.data.contiguous())
    return arena


def _replace_placeholders(model: nn.Module) -> None:
    """Swap the meta placeholders of tables left on the GGUF's map (an untied embedding) for the file's
    weights they stand for (`BlockWeight.source`); StaleWeightCache when any placeholder remains."""
    for m in model.modules():
        if isinstance(m, BlockEmbedding) and m.table.data.is_meta:
            if m.table.source is None:
                raise StaleWeightCache("an embedding table has no bytes")
            m.set_table(m.table.source)
        tensors = [*m._buffers.values(), *m._parameters.values()]
        tensors += [getattr(v, "data", v) for v in m.__dict__.values() if isinstance(v, torch.Tensor | BlockWeight)]
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in tensors):
            raise StaleWeightCache(f"{type(m).__name__} holds a weight with no bytes")


class BlockLinear(nn.Module):
    """y = x W^T (+ b), W the row concatenation of `parts` (GGUF blocks); x and y fp32.

    Row padding: the native kernel fixes each row's reduction order, so a row's bits do not depend on
    the row count; the torch reference path (no native library) is a plain fp32 GEMM, which needs the
    model's row padding for that (`needs_row_padding`, read by decoder.CausalLM)."""

    def __init__(self, parts: list[BlockWeight], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not parts or len({p.shape[1] for p in parts}) != 1:
            raise ValueError("BlockLinear: needs one or more parts with the same input size")
        self.set_parts(parts)
        self.bias = None if bias is None else nn.Parameter(bias.float().contiguous(), requires_grad=False)
        self.in_features = parts[0].shape[1]
        self.out_features = sum(p.shape[0] for p in parts)
        self.needs_row_padding = not kernels.native_available()

    def set_parts(self, parts: list[BlockWeight]) -> None:
        """Hold `parts`; their tensors are also registered as buffers so weight_bytes counts them."""
        self.parts = list(parts)
        for i, p in enumerate(self.parts):
            self.register_buffer(f"part{i}", p.data, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().contiguous()
        if len(self.parts) == 1:
            y = qmatmul(x, self.parts[0])
        else:   # each part writes its own columns of one output (no concatenation copy)
            y = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
            start = 0
            for p in self.parts:
                qmatmul(x, p, out=y[:, start:start + p.shape[0]])
                start += p.shape[0]
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        types = "+".join(p.type_name for p in self.parts)
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={types}"


class BlockEmbedding(nn.Module):
    """Embedding lookup that dequantizes only the requested rows of a BlockWeight table."""

    def __init__(self, weight: BlockWeight) -> None:
        super().__init__()
        self.set_table(weight)
        self.num_embeddings, self.embedding_dim = weight.shape

    def set_table(self, weight: BlockWeight) -> None:
        """Hold `weight`; its tensor is also registered as a buffer so weight_bytes counts it."""
        self.table = weight
        self.register_buffer("data", weight.data, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).long()
        if flat.numel() == 1:   # a decode step's one token: no dedup needed
            return self.table.dequantize(flat).view(*ids.shape, self.embedding_dim)
        uniq, inverse = torch.unique(flat, return_inverse=True)   # each distinct row dequantized once
        rows = self.table.dequantize(uniq)
        return rows.index_select(0, inverse).view(*ids.shape, self.embedding_dim)
