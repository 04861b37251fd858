"""The q8_0 KV cache's codec in torch: the reference the native kernels (csrc/common/vec16.h: q8_0_quant_row,
q8_0_dequant_row) are tested against.

A row of D values (D % 32 == 0) is D / 32 blocks of llama.cpp's block_q8_0, 34 bytes each: the scale d as
fp16 (little-endian), then 32 int8 q. Quantized as ggml-quants.c's quantize_row_q8_0_ref, in fp32:

    amax = max |x_j|;  d = amax / 127;  id = d ? 1 / d : 0;  q_j = roundf(x_j * id)   (half away from zero)

and d rounded to fp16 (nearest even) only when stored (the q use the fp32 d, as there). Dequantized as
dequantize_row_q8_0: x_j = fp32(d) * q_j, exact in fp32 (11 x 8 significant bits), so every reader gets the
same values whatever its order of operations. The bytes are those of a GGUF Q8_0 row of the same values.

K rows are rotated before they are quantized (llama.cpp's `attn_rot_k`, PR #21038): `rotate` is the normalized
Walsh-Hadamard transform H over head_dim (a power of two), orthonormal and symmetric, so q . k = (H q) . (H k):
the cache holds quantize(H k) and the attention reads it with H q (write_kv / paged_attention / sink_attention
here, decode_layer.c's attention_part in the fused layer). V rows are rotated too (llama.cpp's `attn_rot_v`), by
H_64 on each run of 64 values (`rotate_v`; llama.cpp's choice, the smaller transform measured better there): the
cache holds quantize(H_64 v), so the attention computes H_64 o, and the readers hand back H_64 (H_64 o) = o per
head before o_proj (paged_attention / sink_attention, attention_part). H spreads an outlier channel over every
value it mixes, so one block's scale does not serve it alone (tests/models/test_kv_dtype_perplexity.py bounds
the perplexity against the fp32 cache). The butterfly below is vec16.h's q8_0_rotate_row float op
for float (fp32 sums a + b, a - b over log2(n) stages, then one multiply by fp32(1 / sqrt(n))), so both writers
store the same bytes and both readers un-rotate the output to the same bits.
"""

from __future__ import annotations

import math

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


def rotate(x: torch.Tensor) -> torch.Tensor:
    """H x over the last dim (D a power of two): the normalized fast Walsh-Hadamard transform in fp32, returned
    in x's dtype. H is its own inverse (H H = I)."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"q8_0 rotation: rows of {d} values are not a power of two")
    y, h = x.float(), 1
    while h < d:   # stage h: pairs (j, j + h) in each run of 2h values -> (a + b, a - b)
        y = y.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
        h *= 2
    return (y.reshape(x.shape) * torch.tensor(1 / math.sqrt(d), dtype=torch.float32)).to(x.dtype)


V_ROT = 64   # values per run that rotate_v transforms (llama.cpp's V rotation size)


def rotate_v(x: torch.Tensor) -> torch.Tensor:
    """H_n on each run of n = min(64, D) values of the last dim (V rows and the attention output over them;
    its own inverse, as `rotate`)."""
    d = x.shape[-1]
    n = min(V_ROT, d)
    return rotate(x.reshape(*x.shape[:-1], d // n, n)).reshape(x.shape)


def dequantize(b: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q8_0 bytes `[..., D / 32 * 34]` (uint8) to their values `[..., D]` (fp32 d * q, then `dtype`)."""
    if b.dtype != Q8_0 or b.shape[-1] % Q8_0_BLOCK_BYTES:
        raise ValueError(f"q8_0: {b.dtype} rows of {b.shape[-1]} bytes are not whole blocks")
    blocks = b.reshape(*b.shape[:-1], b.shape[-1] // Q8_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES)
    d = blocks[..., :2].contiguous().view(torch.float16).float()     # [..., nb, 1]
    q = blocks[..., 2:].contiguous().view(torch.int8).float()
    return (d * q).reshape(*b.shape[:-1], -1).to(dtype)
