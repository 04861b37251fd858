"""Does attention's GEMM give a query row the same bits whatever the row count? Probed, per dtype.

Batch invariance needs each output row to be bitwise independent of how many other rows share a GEMM.
torch's fp32 CPU GEMM is not (M = 1, 2, 3 take other kernels than M = 8, 16, ...), so attention pads
each work item's query rows to a multiple of 8. On CPUs with AVX512-BF16, torch's bf16 batched matmul
over attention's short reductions (head_dim, and the 128-key tiles) is row-count invariant, so a bf16
decode item can keep its G real rows instead of 8 (2.7x less attention work for SmolLM2's G = 3).
(bf16 F.linear with K = 1536 is *not* invariant at M = 1 for some inputs, so dense linears keep their
padding.) Which case holds depends on the CPU and the torch build, so it is measured at load, not
assumed: many random trials at several row counts; any mismatch -> pad.
"""

from __future__ import annotations

from functools import cache

import torch

from hitenter.models.attention import ROW_MULTIPLE

PROBE_ROWS = (1, 2, 3, 5, 8, 9, 13, 24)
TRIALS = 16


@cache
def attention_row_multiple(dtype: torch.dtype, head_dim: int, key_tile: int) -> int:
    """1 if Q.K^T (reducing head_dim) and P.V (reducing key_tile) in `dtype` give every row the same bits
    at all probed row counts over TRIALS random draws, else ROW_MULTIPLE."""
    g = torch.Generator().manual_seed(0)
    n = max(PROBE_ROWS)
    for t in range(TRIALS):
        k = torch.randn(3, head_dim, key_tile * (1 + t % 4), generator=g).to(dtype)
        q = torch.randn(3, n, head_dim, generator=g).to(dtype)
        v = torch.randn(3, 2, key_tile, head_dim, generator=g).to(dtype)
        e = torch.rand(3, 2, n, key_tile, generator=g).to(dtype)
        full_s, full_o = torch.matmul(q, k), torch.matmul(e, v)
        for m in PROBE_ROWS:
            if not (torch.equal(torch.matmul(q[:, :m], k), full_s[:, :m])
                    and torch.equal(torch.matmul(e[:, :, :m], v), full_o[:, :, :m])):
                return ROW_MULTIPLE
    return 1
