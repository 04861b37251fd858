"""Causal attention with attention sinks (gpt-oss): one learned logit per head that joins every row's
softmax denominator and nothing else,

    p_j = exp(s_j - m) / (sum_k exp(s_k - m) + exp(sink_h - m)),   m = max(max_k s_k, sink_h),

llama.cpp's `ggml_soft_max_add_sinks`. Computed per sequence on the gathered paged keys in fp32, plainly:
the native kernels do not take sinks (a gpt-oss layer runs its rows here). A row's bits do not depend on
the other sequences of the step; they may depend on how many of its own sequence's rows share the step
(torch CPU GEMM shapes), so chunk invariance is not promised for these layers.
"""

from __future__ import annotations

import torch

from hitenter.models import kv_q8_0
from hitenter.models.attention import AttentionMetadata, widen_rows
from hitenter.models.kv_dtype import Q8_0


def _positions_slots(meta: AttentionMetadata, i: int) -> torch.Tensor:
    """The cache slots of sequence i's keys 0 .. seq_lens[i] - 1."""
    pos = torch.arange(meta.seq_lens[i])
    table = torch.tensor(meta.table(i), dtype=torch.long)
    return table[pos // meta.block_size] * meta.block_size + pos % meta.block_size


def sink_attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, meta: AttentionMetadata, scale: float,
                   window: int | None, sinks: torch.Tensor) -> torch.Tensor:
    """q `[T, H, D]` (the step's rows, K/V already written) -> `[T, H, D]`; `sinks` `[H]`; `window` as
    paged_attention's (keys with position - key >= window masked)."""
    t, nh, d = q.shape
    _, kvh, nb, bs, w = kv_cache_layer.shape
    flat = kv_cache_layer.view(2, kvh, nb * bs, w)
    out = torch.empty(t, nh, d, dtype=q.dtype)
    q8 = kv_cache_layer.dtype == Q8_0
    if q8:   # rotated rows H k and H_64 v (write_kv): keys met by H q, the output H_64 o undone below
        q = kv_q8_0.rotate(q)
    for i in range(meta.num_seqs):
        a, b = meta.query_start_loc[i], meta.query_start_loc[i + 1]
        if a == b:
            continue
        slots = _positions_slots(meta, i)
        k = widen_rows(flat[0].index_select(1, slots), torch.float32).repeat_interleave(nh // kvh, 0)   # [H, L, D]
        v = widen_rows(flat[1].index_select(1, slots), torch.float32).repeat_interleave(nh // kvh, 0)
        s = torch.matmul(q[a:b].float().transpose(0, 1) * scale, k.transpose(1, 2))   # [H, n, L]
        pos = torch.arange(meta.seq_lens[i] - (b - a), meta.seq_lens[i])[:, None]
        keys = torch.arange(slots.numel())[None, :]
        mask = keys > pos
        if window is not None:
            mask |= pos - keys >= window
        s = s.masked_fill(mask, float("-inf"))
        sink = sinks.float().view(nh, 1, 1).expand(nh, b - a, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        out[a:b] = torch.matmul(p, v).transpose(0, 1).to(q.dtype)
    return kv_q8_0.rotate_v(out) if q8 else out
