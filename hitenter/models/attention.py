"""Paged KV cache and batch-invariant causal attention over a flat batch of tokens.

Layout: a layer's KV cache is `[2, num_blocks, block_size, num_kv_heads, head_dim]` (index 0 = K,
1 = V); a token's slot is `block_id * block_size + offset`. A step processes T new tokens from S
sequences, described by AttentionMetadata (passed explicitly, never a global).

Batch invariance contract: `paged_attention`'s output rows for one sequence are bitwise identical
whatever other sequences share the batch and however that sequence's prompt was split into chunks.
It is achieved by computing each sequence alone with shapes that only change in ways that do not
change a row's bits on torch CPU:
  * query rows are padded to a multiple of 8 (GEMM rows, as for the linears);
  * keys are zero-padded to a multiple of KEY_TILE and masked; Q.K^T only reduces over head_dim;
  * softmax numerators/denominators are reduced per key tile of fixed size KEY_TILE, and the tiles
    are accumulated left to right in a Python loop, so extra (fully masked) tiles add exact zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hitenter.config import ModelConfig

KEY_TILE = 128  # keys per softmax/PV tile; fixed so a row's reduction order never depends on context length
ROW_MULTIPLE = 8  # query rows are padded to this multiple (batch-invariant GEMM shapes)


@dataclass
class AttentionMetadata:
    """Per-step attention description (see docs/CONTRACTS.md).

    query_start_loc: S+1 offsets; sequence i's new tokens are rows qsl[i]:qsl[i+1] of the flat batch.
    seq_lens: S context lengths after this step (already computed tokens + new tokens).
    block_tables: S lists of block ids covering at least seq_lens[i] tokens.
    slot_mapping: LongTensor[T], cache slot of each new token.
    block_size: tokens per KV block.
    """

    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: torch.Tensor
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int,
                       dtype: torch.dtype = torch.float32, num_kv_heads: int | None = None) -> list[torch.Tensor]:
    """One zeroed tensor `[2, num_blocks, block_size, num_kv_heads, head_dim]` per layer.

    num_kv_heads: the KV heads this process holds (a tensor-parallel rank's shard); default all."""
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}")
    kvh = config.num_kv_heads if num_kv_heads is None else num_kv_heads
    shape = (2, num_blocks, block_size, kvh, config.head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(config.num_layers)]


def write_kv(kv_cache_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store k, v (`[T, num_kv_heads, head_dim]`) at the given cache slots (in place)."""
    _, nb, bs, kvh, hd = kv_cache_layer.shape
    flat = kv_cache_layer.view(2, nb * bs, kvh, hd)
    flat[0].index_copy_(0, slot_mapping, k.to(kv_cache_layer.dtype))
    flat[1].index_copy_(0, slot_mapping, v.to(kv_cache_layer.dtype))


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _gather_kv(kv_cache_layer: torch.Tensor, block_table: list[int], seq_len: int,
               padded_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous K, V `[padded_len, kvh, hd]` of one sequence; rows >= seq_len are zeros."""
    bs = kv_cache_layer.shape[2]
    nblocks = (seq_len + bs - 1) // bs
    if len(block_table) < nblocks:
        raise ValueError(f"block table has {len(block_table)} blocks, {nblocks} needed for {seq_len} tokens")
    idx = torch.tensor(block_table[:nblocks], dtype=torch.long)
    kv = kv_cache_layer[:, idx].flatten(1, 2)[:, :seq_len]  # [2, seq_len, kvh, hd]
    if padded_len > seq_len:
        kv = torch.cat([kv, kv.new_zeros((2, padded_len - seq_len) + tuple(kv.shape[2:]))], dim=1)
    return kv[0], kv[1]


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int, scale: float) -> torch.Tensor:
    """Causal GQA attention of one sequence's new rows (batch-invariant shapes, see module doc).

    q: `[n, H, D]` queries at positions start_pos..start_pos+n-1; k, v: `[L, KVH, D]` with
    L >= start_pos + n a multiple of KEY_TILE (rows past the context must be finite, e.g. zeros).
    Returns `[n, H, D]`.
    """
    n, nh, d = q.shape
    L, kvh, _ = k.shape
    g = nh // kvh
    n8 = _round_up(n, ROW_MULTIPLE)
    if n8 != n:
        q = torch.cat([q, q.new_zeros(n8 - n, nh, d)])
    # [n8, H, D] -> [KVH, G*n8, D]; head h uses kv head h // G
    qg = (q * scale).permute(1, 0, 2).reshape(kvh, g * n8, d)
    scores = torch.matmul(qg, k.permute(1, 2, 0))  # [KVH, G*n8, L]
    pos = torch.arange(start_pos, start_pos + n8).clamp_(max=start_pos + n - 1)
    masked = torch.arange(L)[None, :] > pos[:, None]  # [n8, L]
    scores = scores.view(kvh, g, n8, L).masked_fill_(masked, float("-inf")).view(kvh, g * n8, L)
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    nt = L // KEY_TILE
    m = g * n8
    e_t = e.view(kvh, m, nt, KEY_TILE)
    den_t = e_t.sum(dim=-1)  # [KVH, M, nt]
    num_t = torch.matmul(e_t.permute(0, 2, 1, 3).contiguous(),
                         v.view(nt, KEY_TILE, kvh, d).permute(2, 0, 1, 3))  # [KVH, nt, M, D]
    num, den = num_t[:, 0], den_t[:, :, 0]
    for t in range(1, nt):
        num = num + num_t[:, t]
        den = den + den_t[:, :, t]
    out = num / den.unsqueeze(-1)  # [KVH, M, D]
    return out.view(kvh, g, n8, d).reshape(nh, n8, d).permute(1, 0, 2)[:n]


def paged_attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    """Causal attention of the flat batch q `[T, H, D]` against each sequence's paged K/V.

    The new tokens' K/V must already be written (write_kv). Query row j of sequence i sits at position
    seq_lens[i] - n_i + j and sees keys 0..that position. Returns `[T, H, D]` (contiguous).
    Batch invariant, see the module docstring.
    """
    out = torch.empty_like(q)
    qsl = meta.query_start_loc
    for i, seq_len in enumerate(meta.seq_lens):
        a, b = qsl[i], qsl[i + 1]
        if b <= a:
            continue
        n = b - a
        if n > seq_len:
            raise ValueError(f"sequence {i} has {n} new tokens but seq_len {seq_len}")
        padded = _round_up(seq_len, KEY_TILE)
        k, v = _gather_kv(kv_cache_layer, meta.block_tables[i], seq_len, padded)
        out[a:b] = attend_one(q[a:b], k, v, seq_len - n, scale)
    return out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int,
                        scale: float | None = None) -> torch.Tensor:
    """Plain contiguous causal GQA attention in float64 (tests only).

    q `[n, H, D]` at positions start_pos.., k/v `[L, KVH, D]` with L = start_pos + n. Returns fp32 `[n, H, D]`.
    """
    n, nh, d = q.shape
    kvh = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kk = k.double().repeat_interleave(nh // kvh, dim=1)
    vv = v.double().repeat_interleave(nh // kvh, dim=1)
    s = torch.einsum("nhd,lhd->hnl", q.double() * scale, kk)
    pos = torch.arange(start_pos, start_pos + n)
    s = s.masked_fill(torch.arange(k.shape[0])[None, :] > pos[:, None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, dim=-1), vv).float()
