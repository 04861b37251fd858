"""The q8_0 KV cache's codec in torch: the reference the native kernels (csrc/vec16.h: q8_0_quant_row,
q8_0_dequant_row) are tested against.

A row of D values (D % 32 == 0) is D / 32 blocks of llama.cpp's block_q8_0, 34 bytes each: the scale d as
fp16 (little-endian), then 32 int8 q. Quantized as ggml-quants.c's quantize_row_q8_0_ref, in fp32:

    amax = max |x_j|;  d = amax / 127;  id = d ? 1 / d : 0;  q_j = roundf(x_j * id)   (half away from zero)

and d rounded to fp16 (nearest even) only when stored (the q use the fp32 d, as there). Dequantized as
dequantize_row_q8_0: x_j = fp32(d) * q_j, exact in fp32 (11 x 8 significant bits), so every reader gets the
same values whatever its order of operations. The bytes are those of a GGUF Q8_0 row of the same values.
"""

from __future__ import annotations

import torch

from hitenter.models.kv_dtype import Q8_0, Q8_0_BLOCK_BYTES, QK8_0


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: to the nearest integer, halves away from zero (torch.round rounds halves to even)."""
    t = torch.trunc(x)
    return t + torch.where((x - t).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))   # x - t is exact


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Rows `[..., D]` (any float dtype, taken as fp32) to their q8_0 bytes `[..., D / 32 * 34]` (uint8)."""
    d_model = x.shape[-1]
    if d_model % QK8_0:
        raise ValueError(f"q8_0: rows of {d_model} values are not whole blocks of {QK8_0}")
    blocks = x.float().reshape(*x.shape[:-1], d_model // QK8_0, QK8_0)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = _roundf(blocks * inv).to(torch.int8)
    scale = d.to(torch.float16).view(torch.uint8)                # [..., nb, 2]: the fp16's bytes (little-endian)
    return torch.cat([scale, q.view(torch.uint8)], dim=-1).reshape(*x.shape[:-1], -1)


def dequantize(b: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q8_0 bytes `[..., D / 32 * 34]` (uint8) to their values `[..., D]` (fp32 d * q, then `dtype`)."""
    if b.dtype != Q8_0 or b.shape[-1] % Q8_0_BLOCK_BYTES:
        raise ValueError(f"q8_0: {b.dtype} rows of {b.shape[-1]} bytes are not whole blocks")
    blocks = b.reshape(*b.shape[:-1], b.shape[-1] // Q8_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES)
    d = blocks[..., :2].contiguous().view(torch.float16).float()     # [..., nb, 1]
    q = blocks[..., 2:].contiguous().view(torch.int8).float()
    return (d * q).reshape(*b.shape[:-1], -1).to(dtype)
