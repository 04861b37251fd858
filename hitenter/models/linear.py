"""Dense (fp32 / bf16) linear layers, their weights packed once at load for oneDNN.

torch's `F.linear` on CPU hands a plain `[N, K]` weight to oneDNN (bf16) or MKL (fp32), and oneDNN
re-lays the weight out into its blocked format on every call: at decode's small row counts that copy
costs about as much as the GEMM. Packing the weight once (`torch.ops.mkldnn._reorder_linear_weight`,
the op Inductor's freezing pass uses) and calling `torch.ops.mkldnn._linear_pointwise` skips it, at every
row count (bench/dense_gemm.py measures it; figures: docs/benchmarks.md).

Bits: in bf16 the packed call is bitwise `F.linear` (same oneDNN kernel, tests/models/test_decoder.py checks
it). In fp32 it is oneDNN's GEMM instead of MKL's, so logits move by float rounding (the HF goldens
still hold). Batch invariance needs a row's bits not to depend on the row count, for the multiples of
ROW_MULTIPLE the model pads to: `packed_rows_invariant` probes that at load per dtype, and a dtype that
fails it keeps plain `F.linear`.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.models.attention import ROW_MULTIPLE

PACK_ROWS_HINT = 64       # oneDNN's row-count hint for the packed layout (any count runs, at the same speed)
PROBE_SHAPES = ((96, 64), (192, 256), (48, 160))   # (N, K): small, so the probe costs milliseconds
PROBE_TRIALS = 8


def _has_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[M, K]` times the packed `[N, K]` weight, transposed: `[M, N]` (+ bias)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


@cache
def packed_rows_invariant(dtype: torch.dtype) -> bool:
    """True if oneDNN is here and its packed GEMM gives each row the same bits at every probed row count
    that is a multiple of ROW_MULTIPLE (PROBE_TRIALS random draws per shape)."""
    if dtype not in (torch.float32, torch.bfloat16) or not _has_onednn():
        return False
    g = torch.Generator().manual_seed(0)
    counts = [ROW_MULTIPLE * m for m in (1, 2, 3, 5, 16)]
    try:
        for t in range(PROBE_TRIALS):
            n, k = PROBE_SHAPES[t % len(PROBE_SHAPES)]
            w = torch.randn(n, k, generator=g).to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT)
            x = torch.randn(max(counts), k, generator=g).to(dtype)
            full = packed_matmul(x, packed)
            if any(not torch.equal(packed_matmul(x[:m], packed), full[:m]) for m in counts):
                return False
    except RuntimeError:   # a torch build whose oneDNN lacks this dtype
        return False
    return True


def pack_weight(w: torch.Tensor) -> torch.Tensor | None:
    """w in oneDNN's packed layout, or None where the packed GEMM is unavailable or not row invariant."""
    if w.device.type != "cpu" or not packed_rows_invariant(w.dtype):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_ROWS_HINT)


class Linear(nn.Module):
    """y = x W^T (+ b) in fp32/bf16. Callers pass row counts that are multiples of 8 (models/decoder.py).

    The weight lives either packed (`packed`, an opaque oneDNN tensor) or plain (`weight`), never both."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        w = weight.to(dtype).contiguous()
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype).contiguous(), requires_grad=False)
        packed = pack_weight(w)
        self.weight = None if packed is not None else nn.Parameter(w, requires_grad=False)
        self.register_buffer("packed", packed)
        self.out_features, self.in_features = w.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return packed_matmul(x, self.packed, self.bias)
