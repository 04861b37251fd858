"""The KV cache's element type (`kv_cache_dtype`, vLLM's option): float32, bfloat16, float16 or q8_0.

Every reader and writer handles all three: write_kv rounds K/V to the cache type (torch's
round-to-nearest-even), the GEMM path (attention.py) widens the gathered keys to the query dtype, and
the native kernels (csrc/attention/decode_attention.c, prompt_attention.c, decode_layer.c) widen each element
to fp32 as they load it and round once when the fused layer writes it. So a half-precision cache
changes only the stored K/V values, never the order of any sum: a kernel over an f16 / bf16 cache
gives bitwise the result it gives over an fp32 cache holding the same rounded values, and batch
invariance holds as before.

`auto` (the default): half precision wherever the activations are fp32 and the weights are not the float32
reference: `auto_half()`, the half type this CPU converts fastest (f16 with F16C: vcvtph2ps, one instruction
per 8 values; else bf16); f16 keeps 10 mantissa bits against bf16's 7 and K/V values sit well inside its
range (65504). It halves the bytes per token (Qwen2.5-1.5B: 57,344 -> 28,672), so a long context reads half
the bytes per decode step and twice the tokens fit. bf16 for dense bf16 weights; fp32 for the float32
reference load (`dtype float32`), which the exact tests compare against HF and llama.cpp. On AVX2 the
kernels widen a half tile once into fp32 (csrc/attention/attn_avx2.h): the f16 decode kernel runs as fast as fp32.

q8_0 (llama.cpp's `--cache-type-k/v q8_0`): each head row of head_dim values is head_dim / 32 blocks of
llama.cpp's block_q8_0 (an fp16 scale d, then 32 int8 q; 34 bytes), quantized as ggml-quants.c's
quantize_row_q8_0_ref (kv_q8_0.py); the cache tensor is then bytes (`Q8_0`, torch.uint8) of shape
`[2, KVH, NB, BS, head_dim / 32 * 34]`: the paged layout unchanged, a row 34/32 bytes per value (53% of f16).
Readers dequantize d * q (exact in fp32) as they load a tile, so a kernel over a q8_0 cache computes what it
computes over an fp32 cache holding the dequantized values; only the stored values change, never the order
of a sum, and batch invariance holds as before. K rows are stored rotated (H k, a Walsh-Hadamard transform;
the queries meet them as H q) and V rows as H_64 v (the output rotated back per head: kv_q8_0.py), as llama.cpp's
q8_0 cache does. Head dims that are not a power of two >= 32 refuse q8_0 at load.

Bytes per token (K and V, every layer): SmolLM2-135M 46,080 fp32 / 23,040 f16 / 12,240 q8_0; Qwen2.5-0.5B
24,576 / 12,288 / 6,528; Qwen2.5-1.5B 57,344 / 28,672 / 15,232; Gemma 3 270M 36,864 / 18,432 / 9,792.
"""

from __future__ import annotations

import functools
import platform

import torch

Q8_0 = torch.uint8   # a q8_0 cache's tensor elements: the bytes of its blocks (see the module doc)
QK8_0 = 32           # values per q8_0 block
Q8_0_BLOCK_BYTES = 34   # its fp16 scale and 32 int8

TORCH_KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "q8_0": Q8_0}
# the native kernels' element codes (csrc/common/vec16.h: KV_F32 .. KV_Q8_0; `types` in decode_attention.c)
KV_TYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, Q8_0: 3}


@functools.cache
def cpu_has_f16c() -> bool:
    """True where f16 <-> f32 conversion is a hardware instruction (x86 F16C; ARMv8 always)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "f16c" in line.split()
    except OSError:
        pass
    return False


def auto_half() -> torch.dtype:
    """The half-precision cache type this CPU converts fastest: float16 with F16C, else bfloat16."""
    return torch.float16 if cpu_has_f16c() else torch.bfloat16


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype, load_dtype: str = "auto") -> torch.dtype:
    """The cache's torch dtype for the option `kv_cache_dtype` and a model loaded with `load_dtype`
    (its activations in `model_dtype`)."""
    if kv_cache_dtype != "auto":
        return TORCH_KV_DTYPES[kv_cache_dtype]
    if model_dtype != torch.float32 or load_dtype == "float32":
        return model_dtype   # bf16 weights: bf16; the float32 reference: fp32 (see the module doc)
    return auto_half()


def kv_dtype_name(kv_dtype: torch.dtype) -> str:
    """The option's name of a cache type: "q8_0" for Q8_0, else the torch name ("float16")."""
    return "q8_0" if kv_dtype == Q8_0 else str(kv_dtype).removeprefix("torch.")


def check_head_dim(kv_dtype: torch.dtype, head_dim: int) -> None:
    """ValueError (one line) where the cache type cannot hold rows of head_dim values: q8_0 needs whole blocks
    and a power of two (its keys' rotation)."""
    if kv_dtype == Q8_0 and head_dim % QK8_0:
        raise ValueError(f"kv_cache_dtype q8_0: head_dim {head_dim} is not a multiple of {QK8_0} (q8_0 stores "
                         f"blocks of {QK8_0} values); use float16 or bfloat16")
    if kv_dtype == Q8_0 and head_dim & (head_dim - 1):
        raise ValueError(f"kv_cache_dtype q8_0: head_dim {head_dim} is not a power of two (q8_0 keys are rotated by "
                         f"a Walsh-Hadamard transform, kv_q8_0.py); use float16 or bfloat16")


def row_width(kv_dtype: torch.dtype, head_dim: int) -> int:
    """Elements of one head row of the cache tensor (its last dim): head_dim, or q8_0's bytes."""
    if kv_dtype == Q8_0:
        check_head_dim(kv_dtype, head_dim)
        return head_dim // QK8_0 * Q8_0_BLOCK_BYTES
    return head_dim


def cache_head_dim(kv_cache_layer: torch.Tensor) -> int:
    """The head dim of a layer's cache `[2, KVH, NB, BS, row]` (row: head_dim values, or q8_0's bytes)."""
    w = kv_cache_layer.shape[-1]
    return w // Q8_0_BLOCK_BYTES * QK8_0 if kv_cache_layer.dtype == Q8_0 else w


def value_bytes(kv_dtype: torch.dtype) -> float:
    """Bytes per cached value: 4, 2, or q8_0's 34 / 32."""
    return Q8_0_BLOCK_BYTES / QK8_0 if kv_dtype == Q8_0 else torch.empty(0, dtype=kv_dtype).element_size()


def type_codes(kv_dtype: torch.dtype, q_dtype: torch.dtype) -> int:
    """The kernels' `types` argument: cache element code + 4 x query/output element code."""
    return KV_TYPE_CODES[kv_dtype] + 4 * KV_TYPE_CODES[q_dtype]
