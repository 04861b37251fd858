"""Linear / embedding modules over the quantized layouts of hitenter/quant/weights.py.

The kernel is chosen by the weight's layout (`quant_linear`), never by the device:
* `Int8Linear`: `torch.ops.aten._weight_int8pack_mm(x, q int8 [N, K], scales [N])`.
* `Int4Linear`: `torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros [K/32, N, 2])`
  on the layout `_convert_weight_to_int4pack_for_cpu` packs (N padded to a multiple of 16, which the
  packer requires; the padding columns are sliced off).

Compute dtype: in torch 2.13 CPU both kernels are vectorized (AVX512) only for bfloat16 activations;
float32 / float16 activations take a scalar fallback many times slower than fp32 F.linear
(bench/quant.py `--kernels` measures it). So the quantized linears take the model's activations, run the
kernel in `compute_dtype` (bfloat16 by default; scales / zeros stored in it) and return the model dtype.
float32 compute is available (exact reference, slow). Both kernels give a row the same bits whatever
the row count M (tested in tests/quant/test_quant.py), so batch invariance holds with or without padding.
"""

from __future__ import annotations

import torch
from torch import nn

from hitenter.quant.weights import GROUP, Int4Weight, Int8Weight

DEFAULT_COMPUTE_DTYPE = torch.bfloat16


class Int8Linear(nn.Module):
    """y = x (q * scale)^T (+ b) with int8 weights and per-output-row scales."""

    def __init__(self, weight: Int8Weight, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 compute_dtype: torch.dtype = DEFAULT_COMPUTE_DTYPE) -> None:
        super().__init__()
        self.compute_dtype = compute_dtype
        self.register_buffer("q", weight.q.to(torch.int8).contiguous())
        self.register_buffer("scale", weight.scale.to(compute_dtype).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(self.compute_dtype).contiguous(), self.q, self.scale)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias


class Int4Linear(nn.Module):
    """y = x W^T (+ b), W = (q - 8) * scale + zero per 32-wide group, q packed 4-bit for the CPU kernel."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 compute_dtype: torch.dtype = DEFAULT_COMPUTE_DTYPE) -> None:
        super().__init__()
        n, k = weight.shape
        if k % GROUP:
            raise ValueError(f"Int4Linear: input size {k} is not a multiple of the group size {GROUP}")
        self.compute_dtype = compute_dtype
        self.out_features = n
        pad = (-n) % 16
        q, scale, zero = weight.q, weight.scale, weight.zero
        if pad:
            q = torch.cat([q, q.new_full((pad, k), 8)])
            scale = torch.cat([scale, scale.new_zeros((pad, k // GROUP))])
            zero = torch.cat([zero, zero.new_zeros((pad, k // GROUP))])
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros",
                             torch.stack([scale.t(), zero.t()], dim=-1).to(compute_dtype).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(self.compute_dtype).contiguous(), self.packed, GROUP,
                                                        self.scales_and_zeros)
        if y.shape[1] != self.out_features:
            y = y[:, :self.out_features]
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias


def quant_linear(weight: Int8Weight | Int4Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> nn.Module:
    """The module for this weight's layout."""
    if isinstance(weight, Int4Weight):
        return Int4Linear(weight, bias, dtype)
    if isinstance(weight, Int8Weight):
        return Int8Linear(weight, bias, dtype)
    raise TypeError(f"no quantized linear for weights of type {type(weight).__name__}")


def weight_bytes(module: nn.Module) -> int:
    """Resident bytes of a module's parameters and buffers (each storage once)."""
    seen: set[int] = set()
    total = 0
    tensors = list(module.parameters()) + list(module.buffers())
    for t in tensors:
        if t.is_mkldnn:   # an opaque packed weight (models/linear.py): its own storage
            total += t.numel() * t.element_size()
        elif t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
