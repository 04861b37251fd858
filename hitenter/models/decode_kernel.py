"""The fused paged-attention kernel for generation rows (csrc/attention/decode_attention.c), built on first use.

Why: the torch path (attention.py) gathers each sequence's K/V blocks into a contiguous copy and then
runs GEMMs on it, so a decode step reads the cache, writes the copy and reads it again; at 64
sequences x 300 tokens that is half of a bf16 decode step. The kernel reads the blocks in place.

Which rows: a row at position >= its request's prompt length - 1 (the last prompt token, every
generated token and every drafted token) is a *generation row* and goes to the kernel; prompt rows
stay on the GEMM path. The class of a row depends on its position only, never on the schedule, so a
row gets the same bits however prompts are chunked, batched, cached or recomputed after preemption
(attention.py's batch-invariance contract).

Build: hitenter.kernels.build (cc -O3 -march=native -fopenmp, cached in $HITENTER_HOME/kernels keyed by the
source, the flags and this CPU's flags); about a second, once per machine.
Where no C compiler is found, or HITENTER_DECODE_KERNEL=0, `load()` returns None and every row takes
the torch path (the whole engine then consistently uses it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hitenter.kernels.native import DECODE_ATTENTION
from hitenter.models.kv_dtype import KV_TYPE_CODES, cache_head_dim, type_codes
from hitenter.models.step_rows import StepRows

log = logging.getLogger(__name__)

MAX_GROUP = 16      # query heads per KV head the kernel supports
MAX_HEAD_DIM = 512   # Gemma 4's global layers



# the compiled kernel library (native.DECODE_ATTENTION), or None (disabled, no compiler, or the build failed: logged once)
load = DECODE_ATTENTION


def supports(kv_cache_layer: torch.Tensor, num_heads: int, q_dtype: torch.dtype) -> bool:
    """True if the kernel is loaded and handles this cache (dtype, head_dim, GQA group) and query dtype:
    fp32 / bf16 / f16 / q8_0 caches with fp32 queries, or with queries of the cache's own dtype."""
    kvh, d = kv_cache_layer.shape[1], cache_head_dim(kv_cache_layer)
    return (kv_cache_layer.dtype in KV_TYPE_CODES and q_dtype in (torch.float32, kv_cache_layer.dtype)
            and kv_cache_layer.device.type == "cpu" and kv_cache_layer.is_contiguous()
            and d % 16 == 0 and d <= MAX_HEAD_DIM and num_heads % kvh == 0 and num_heads // kvh <= MAX_GROUP
            and load() is not None)


def check_rows(ctx: list[int], tables: list[int], num_blocks: int) -> None:
    """The kernel's inputs for one step, checked once (the C code trusts them): every row sees >= 1 key,
    every block id is in 0..num_blocks-1. ValueError otherwise."""
    if min(ctx) < 1:
        raise ValueError(f"decode_attention: a row sees {min(ctx)} keys (>= 1 needed)")
    if tables and (min(tables) < 0 or max(tables) >= num_blocks):
        bad = next(b for b in tables if not 0 <= b < num_blocks)
        raise ValueError(f"decode_attention: block id {bad} outside the cache's {num_blocks} blocks")


def decode_attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, ctx_lens: torch.Tensor,
                     table_starts: torch.Tensor, tables: torch.Tensor, scale: float,
                     window: int | None = None) -> torch.Tensor:
    """Attention of rows q `[R, H, D]` (row r sees keys 0..ctx_lens[r]-1 of the blocks
    tables[table_starts[r]:], only the last `window` of them when given) against the paged cache;
    returns `[R, H, D]`. Check `supports` first.

    ctx_lens, table_starts, tables: int64 CPU tensors (kept alive by the caller during the call)."""
    lib = load()
    if lib is None:
        raise RuntimeError("decode attention kernel is not available")
    q = q.contiguous()
    if q.dtype not in KV_TYPE_CODES or kv_cache_layer.dtype not in KV_TYPE_CODES or not kv_cache_layer.is_contiguous():
        raise ValueError(f"decode_attention: query {q.dtype} / cache {kv_cache_layer.dtype}, contiguous cache needed")
    r, h, d = q.shape
    _, kvh, nb, bs, _ = kv_cache_layer.shape
    out = torch.empty_like(q)
    rc = lib.decode_attention(q.data_ptr(), out.data_ptr(), kv_cache_layer.data_ptr(),
                              type_codes(kv_cache_layer.dtype, q.dtype), r, ctx_lens.data_ptr(),
                              table_starts.data_ptr(), tables.data_ptr(), h, kvh, nb, bs, d, scale,
                              int(window or 0), torch.get_num_threads())
    if rc == -2:
        raise ValueError("decode_attention: a row with ctx < 1")
    if rc == -3:
        raise MemoryError("decode_attention: no memory for the long rows' chunk states")
    if rc != 0:
        raise ValueError(f"decode_attention: unsupported shape (heads {h}, kv heads {kvh}, head_dim {d})")
    return out


@dataclass
class KernelRows:
    """Generation rows of a step for decode_kernel: row r is flat row rows[r], sees ctx[r] keys, and its
    block table is tables[starts[r]:]; `all_rows` when they are exactly rows 0..T-1 in order.

    Where the metadata has `decode_from`, the rows before it (prompt rows run by the fused layers) are also
    described as runs for the tiled prompt kernel: `prompt` `[NP, 4]` (first row r, row count, first
    position, table start) and the remaining rows as `decode` (their r), `decode_ctx`, `decode_starts`;
    `prompt` None: every row takes the decode kernel."""

    rows: torch.Tensor
    ctx: torch.Tensor
    starts: torch.Tensor
    tables: torch.Tensor
    all_rows: bool
    prompt: torch.Tensor | None = None
    decode: torch.Tensor | None = None
    decode_ctx: torch.Tensor | None = None
    decode_starts: torch.Tensor | None = None


def build_kernel_rows(meta: StepRows, num_blocks: int) -> KernelRows | None:
    rows: list[int] = []
    ctx: list[int] = []
    starts: list[int] = []
    flat: list[int] = []
    runs: list[int] = []     # prompt runs, 4 numbers each
    dec: list[int] = []      # the other rows' r
    qsl = meta.query_start_loc
    decode_from = getattr(meta, "decode_from", None)
    for i, seq_len in enumerate(meta.seq_lens):
        a, b = qsl[i], qsl[i + 1]
        g = meta.gemm_rows(i, True)
        if g == b - a:
            continue
        start = seq_len - (b - a)
        table = meta.table(i)
        n_prompt = 0 if decode_from is None else max(0, min(b - a, decode_from[i] - start) - g)
        if n_prompt:
            runs += [len(rows), n_prompt, start + g, len(flat)]
        dec.extend(range(len(rows) + n_prompt, len(rows) + b - a - g))
        for j in range(g, b - a):
            rows.append(a + j)
            ctx.append(start + j + 1)
            starts.append(len(flat))
        flat.extend(table)
    if not rows:
        return None
    check_rows(ctx, flat, num_blocks)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    kr = KernelRows(as_long(rows), as_long(ctx), as_long(starts), as_long(flat),
                    all_rows=rows == list(range(qsl[-1])))
    if runs:
        d = as_long(dec)
        kr.prompt, kr.decode = as_long(runs).view(-1, 4).t().contiguous(), d
        kr.decode_ctx, kr.decode_starts = kr.ctx.index_select(0, d), kr.starts.index_select(0, d)
    return kr
