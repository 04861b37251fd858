"""The paged attention kernel for prompt rows (csrc/attention/prompt_attention.c), built on first use.

Why: the GEMM path (attention.py) computes each work item's whole score matrix with separate torch
passes (mask, max, exp, sum, P.V per key tile) over gathered copies of the keys, most of a long
prompt's prefill time. The kernel reads the cache in place, tiles 16 keys at a
time across a block of rows (keys reused by every row of the block), and keeps an online softmax.

Which rows: every row the GEMM path would take (prompt rows, before the request's last prompt token;
all rows for callers without generation rows) wherever the queries are fp32 (the cache fp32, bf16, f16 or q8_0), so a row's path still
depends on its position only (attention.py's batch-invariance contract): the kernel's row results do
not depend on the rows that share its block or on the chunking (tested).
`HITENTER_PROMPT_KERNEL=0`, or no compiler: the GEMM path.
"""

from __future__ import annotations

import logging

import torch

from hitenter.kernels.native import PROMPT_ATTENTION
from hitenter.models.kv_dtype import KV_TYPE_CODES, cache_head_dim, type_codes
from hitenter.models.step_rows import StepRows

log = logging.getLogger(__name__)



# the compiled kernel library (native.PROMPT_ATTENTION), or None (disabled, no compiler, or the build failed: logged once)
load = PROMPT_ATTENTION


def supports(kv_cache_layer: torch.Tensor, num_heads: int, q_dtype: torch.dtype) -> bool:
    kvh, d = kv_cache_layer.shape[1], cache_head_dim(kv_cache_layer)
    return (kv_cache_layer.dtype in KV_TYPE_CODES and q_dtype == torch.float32 and kv_cache_layer.is_contiguous()
            and kv_cache_layer.device.type == "cpu" and d % 16 == 0 and d <= 512 and num_heads % kvh == 0
            and num_heads // kvh <= 16 and load() is not None)


def _pieces(meta: StepRows, i: int, use_kernel: bool) -> list[tuple[int, int]]:
    """Sequence i's rows for this kernel, [lo, hi) offsets: its GEMM rows but for bidirectional ranges."""
    pieces = getattr(meta, "range_free_pieces", None)
    if pieces is not None:
        return pieces(i, use_kernel)
    g = meta.gemm_rows(i, use_kernel)
    return [(0, g)] if g else []


def prompt_attention(q: torch.Tensor, out: torch.Tensor, kv_cache_layer: torch.Tensor, meta: StepRows,
                     scale: float, window: int | None, use_kernel: bool) -> None:
    """Write into `out` `[T, H, D]` the rows of q `[T, H, D]` that take the GEMM path (the first
    `meta.gemm_rows(i, use_kernel)` new rows of each sequence i: all of them unless the generation rows
    go to the decode kernel), but for the rows in a bidirectional range (the kernel is causal: attention.py
    attends those); the other rows of `out` are left alone."""
    lib = load()
    if lib is None:
        raise RuntimeError("prompt attention kernel is not available")
    row0: list[int] = []
    nrows: list[int] = []
    pos0: list[int] = []
    starts: list[int] = []
    flat: list[int] = []
    qsl = meta.query_start_loc
    for i, seq_len in enumerate(meta.seq_lens):
        n = qsl[i + 1] - qsl[i]
        for lo, hi in _pieces(meta, i, use_kernel):   # bidirectional ranges left out: attention.py's GEMM path
            row0.append(qsl[i] + lo)
            nrows.append(hi - lo)
            pos0.append(seq_len - n + lo)
            starts.append(len(flat))
            flat.extend(meta.table(i))
    if not row0:
        return
    _, kvh, nb, bs, _ = kv_cache_layer.shape
    d = q.shape[-1]
    if flat and (min(flat) < 0 or max(flat) >= nb):
        raise ValueError(f"prompt_attention: a block id outside the cache's {nb} blocks")
    t = [torch.tensor(x, dtype=torch.long) for x in (row0, nrows, pos0, starts, flat)]
    q = q.contiguous()
    rc = lib.prompt_attention(q.data_ptr(), out.data_ptr(), kv_cache_layer.data_ptr(),
                              type_codes(kv_cache_layer.dtype, torch.float32), len(row0),
                              *(x.data_ptr() for x in t), q.shape[1], kvh, nb, bs, d, scale, int(window or 0),
                              torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"prompt_attention: kernel failed (code {rc}; heads {q.shape[1]}, kv heads {kvh}, "
                           f"head_dim {d})")
