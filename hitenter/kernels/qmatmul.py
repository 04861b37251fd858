"""y = x W^T on GGUF blocks: the native kernel where it loads, else the torch reference.

Contract (both paths): x fp32 `[M, K]` (contiguous), w a BlockWeight `[N, K]` -> fp32 `[M, N]`.
Batch invariance: a row's result never depends on M (the native kernel fixes each row's reduction
order; the reference path is only used when the kernel is absent, for the whole process).
"""

from __future__ import annotations

import torch

from hitenter.kernels.blocks import BlockWeight


def reference_qmatmul(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """Dequantize to fp32, then a plain matmul (slow; the kernels' test reference)."""
    return x.float() @ w.dequantize().t()


def native_available() -> bool:
    """True when the compiled quantized-matmul library is loaded (filled in by the kernel build)."""
    return False


def qmatmul(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """fp32 `[M, N]` = x `[M, K]` @ w^T."""
    return reference_qmatmul(x, w)
