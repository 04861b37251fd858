"""The KV cache's element type (`kv_cache_dtype`, vLLM's option): float32, bfloat16 or float16.

Every reader and writer handles all three: write_kv rounds K/V to the cache type (torch's
round-to-nearest-even), the GEMM path (attention.py) widens the gathered keys to the query dtype, and
the native kernels (csrc/decode_attention.c, prompt_attention.c, decode_layer.c) widen each element
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
kernels widen a half tile once into fp32 (csrc/attn_avx2.h): the f16 decode kernel runs as fast as fp32.
"""

from __future__ import annotations

import functools
import platform

import torch

TORCH_KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the native kernels' element codes (csrc/decode_attention.c: `types`)
KV_TYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


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


def type_codes(kv_dtype: torch.dtype, q_dtype: torch.dtype) -> int:
    """The kernels' `types` argument: cache element code + 4 x query/output element code."""
    return KV_TYPE_CODES[kv_dtype] + 4 * KV_TYPE_CODES[q_dtype]
