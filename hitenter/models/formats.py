"""Which weight format a model is loaded in, from the `dtype` / `quantization` options.

Formats (`WeightFormat`):
* "gguf": the file's own blocks. Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/MXFP4 tensors stay as the GGUF
  stores them (hitenter/kernels BlockWeight) and run by `qmatmul` with fp32 activations; F16/BF16/F32
  tensors are dequantized to dense fp32. The default (`dtype="auto"`, no quantization), because it
  reads the fewest weight bytes per token at the file's own accuracy.
* "dense": every tensor dequantized to `dtype` (float32: the HF-exact reference; bfloat16).
* "int8" / "int4": torch's weight-only kernels (hitenter/quant).

Contract of `resolve_format(dtype, quantization, tensor_parallel)` -> (activation dtype, format):
* quantization None / "none": dtype "auto" -> gguf with fp32; "float32" / "bfloat16" / "float16" (or the
  torch dtype) -> dense in that dtype.
* quantization "gguf": gguf; dtype must be "auto" or float32 (the kernels take fp32 activations).
* quantization "int8" / "int4": that format; dtype "auto" means float32.
* gguf with tensor parallelism: the shards keep the file's blocks (whole block rows per rank; the
  row-parallel layers gather their inputs instead of splitting blocks, models/shard.py), as without it.
* gguf without the native kernels (`hitenter.kernels.native_available()` False): the reference qmatmul
  dequantizes a whole weight per call, far too slow to serve, so the weights are dequantized once at
  load to the dense fp32 path instead (the library's one warning says so: kernels/native.py QMATMUL).
  HITENTER_GGUF_REFERENCE=1 keeps the blocks anyway (the reference path, slow: for tests and kernel work).
Anything else raises ValueError naming the option.
"""

from __future__ import annotations

from typing import Literal

import torch

from hitenter import envs, kernels

WeightFormat = Literal["gguf", "dense", "int8", "int4"]
QUANTIZATION_CHOICES: tuple[str, ...] = ("none", "gguf", "int8", "int4")
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                                  "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """The torch dtype named by `dtype`; None for "auto" / None (let the format decide)."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype: unsupported {dtype}; use 'auto', 'float32' or 'bfloat16'")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {['auto', *DTYPES]}, got {dtype!r}")
    return DTYPES[dtype]


def _native_or_dense() -> WeightFormat:
    """gguf where the native kernels are loaded, else dense fp32 (the library's failure was warned once)."""
    if kernels.native_available() or envs.HITENTER_GGUF_REFERENCE.get():
        return "gguf"
    return "dense"


def resolve_format(dtype: str | torch.dtype | None = "auto", quantization: str | None = None,
                   tensor_parallel: bool = False) -> tuple[torch.dtype, WeightFormat]:
    """(activation dtype, weight format) for these options; see the module doc for the rules."""
    q = quantization or "none"
    if q not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization: must be one of {list(QUANTIZATION_CHOICES)}, got {quantization!r}")
    want = parse_dtype(dtype)
    if q in ("int8", "int4"):
        if tensor_parallel:
            raise ValueError("quantization: quantized weights with tensor parallelism are not supported yet")
        return want or torch.float32, q  # type: ignore[return-value]
    if q == "gguf":
        if want not in (None, torch.float32):
            raise ValueError(f"dtype: quantization='gguf' runs fp32 activations; use dtype 'auto' or 'float32', "
                             f"not {dtype!r}")
        return torch.float32, _native_or_dense()
    if want is not None:
        return want, "dense"
    return torch.float32, _native_or_dense()
