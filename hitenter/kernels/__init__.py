"""Native kernels for GGUF block-quantized weights (y = x W^T on the file's own blocks).

Public API (stable; the model layer depends on nothing else):
* `BlockWeight`: a `[N, K]` weight kept as the GGUF stores it (uint8 rows of blocks), with the row
  operations the model build needs (narrow on dim 0, index_rows, cat_rows for one type).
* `qmatmul(x, w)`: fp32 `x [M, K]` times `w` transposed -> fp32 `[M, N]`; the native kernel where it
  is built and supports the type, else the torch reference path (dequantize, then matmul).
* `reference_qmatmul(x, w)`: the torch reference (what the kernels are tested against).
* `native_available()`: whether the compiled library loaded (one warning when it cannot);
  `native_isa()`: which variant ('avx512vnni', 'avx2', 'generic') or None.
"""

from hitenter.kernels.blocks import BLOCK_TYPES, BlockWeight, block_weight_from_gguf, cat_block_rows
from hitenter.kernels.qmatmul import native_available, native_isa, qmatmul, reference_qmatmul

__all__ = ["BLOCK_TYPES", "BlockWeight", "block_weight_from_gguf", "cat_block_rows", "native_available",
           "native_isa", "qmatmul", "reference_qmatmul"]
