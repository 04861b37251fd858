"""Quantized weight layouts held in memory, and their conversion from GGUF tensors at load.

Two layouts, each run by its own torch CPU kernel (see hitenter/quant/linear.py):

* `Int8Weight`: int8 `q [N, K]` with one scale per output row, w = q * scale[n]
  (`torch.ops.aten._weight_int8pack_mm`). GGUF blocks are 32-wide groups with their own scales
  (Q8_0: w = d_g * q, q in -127..127), which this kernel cannot express, so every source is
  *requantized*: dequantize to fp32 (exactly the GGUF values), then per row s = max|w| / 127
  (rounded to the kernel's scale dtype), q = clamp(round(w / s), -127, 127). The error is at most
  s / 2 per weight, i.e. a 255-level grid over the row's range (finer than Q4's 16 levels per group
  unless a row's max is > 8x its groups' ranges).
* `Int4Weight`: values `q [N, K]` in 0..15 with a scale and zero per 32-wide group,
  w = (q - 8) * scale + zero -- torch's convention for `_weight_int4pack_mm_for_cpu`, checked by
  experiment (and by tests/quant/test_quant.py). GGUF Q4_1 (w = d * q + m) maps exactly: scale = d,
  zero = m + 8 d; Q4_0 (w = d * (q - 8)): scale = d, zero = 0. Other sources are quantized from fp32
  the Q4_1 way (asymmetric min/max per group of 32).

Both support the row operations the model build uses (narrow on dim 0, cat, row permutation), so the
fused Q/K/V and gate/up projections and llama's Q/K un-permutation work on them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

import gguf
import numpy as np
import torch

from hitenter.quant.head import HeadWeight, exact_rows_from_gguf

GROUP = 32
Quantization = Literal["none", "int8", "int4"]
QUANTIZATIONS: tuple[str, ...] = ("none", "int8", "int4")


class _RowOps:
    """Row (dim 0) operations applied to every tensor field of a weight dataclass."""

    shape: tuple[int, int]

    def _map(self, fn: Any) -> Any:
        kw = {f.name: fn(getattr(self, f.name)) if isinstance(getattr(self, f.name), torch.Tensor)
              else getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        return type(self)(**kw)

    def narrow(self, dim: int, start: int, length: int) -> Any:
        if dim == 0:
            return self._map(lambda t: t.narrow(0, start, length))
        if start == 0 and length == self.shape[1]:
            return self
        raise NotImplementedError("quantized weights cannot be split along their input dimension "
                                  "(tensor parallelism with quantization is not supported yet)")

    def index_rows(self, index: torch.Tensor) -> Any:
        return self._map(lambda t: t.index_select(0, index).contiguous())


@dataclass
class Int8Weight(_RowOps):
    q: torch.Tensor        # int8 [N, K]
    scale: torch.Tensor    # [N], the compute dtype
    shape: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self.shape = (int(self.q.shape[0]), int(self.q.shape[1]))

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale.float()[:, None]


@dataclass
class Int4Weight(_RowOps):
    q: torch.Tensor        # uint8 [N, K], values 0..15
    scale: torch.Tensor    # fp32 [N, K / 32]
    zero: torch.Tensor     # fp32 [N, K / 32]
    shape: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self.shape = (int(self.q.shape[0]), int(self.q.shape[1]))

    def dequantize(self) -> torch.Tensor:
        s = self.scale.repeat_interleave(GROUP, 1)
        z = self.zero.repeat_interleave(GROUP, 1)
        return (self.q.float() - 8) * s + z


QuantWeight = Int8Weight | Int4Weight


def cat_rows(ws: list[Any]) -> Any:
    """torch.cat along dim 0 for tensors, field-wise for quantized weights of one layout."""
    if all(isinstance(w, torch.Tensor) for w in ws):
        return torch.cat(ws)
    kinds = {type(w) for w in ws}
    if len(kinds) != 1:
        raise TypeError(f"cannot concatenate weights of different layouts: {sorted(k.__name__ for k in kinds)}")
    first = ws[0]
    kw = {f.name: torch.cat([getattr(w, f.name) for w in ws]) for f in fields(first)
          if isinstance(getattr(first, f.name), torch.Tensor)}
    return type(first)(**kw)


def int8_from_float(w: torch.Tensor, scale_dtype: torch.dtype = torch.bfloat16) -> Int8Weight:
    """Symmetric per-row int8: s = max|w| / 127 (in scale_dtype), q = clamp(round(w / s), -127, 127)."""
    w = w.float()
    s = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).to(scale_dtype)
    q = torch.round(w / s.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), s.contiguous())


def int4_from_float(w: torch.Tensor) -> Int4Weight:
    """Asymmetric 4-bit per 32-wide group (the Q4_1 recipe): d = (max - min) / 15, q = round((w - min) / d)."""
    n, k = w.shape
    g = w.float().reshape(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    d = (hi - lo) / 15.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round((g - lo[..., None]) * inv[..., None]).clamp_(0, 15).to(torch.uint8).reshape(n, k)
    return Int4Weight(q.contiguous(), d.contiguous(), (lo + 8 * d).contiguous())


def int4_from_gguf_blocks(data: np.ndarray, qtype: gguf.GGMLQuantizationType, k: int) -> Int4Weight:
    """Q4_0 / Q4_1 block rows `uint8 [N, K / 32 * block_bytes]` -> the exact Int4Weight."""
    n = data.shape[0]
    nb = k // GROUP
    bytes_per_block = 20 if qtype == gguf.GGMLQuantizationType.Q4_1 else 18
    blocks = np.ascontiguousarray(data).reshape(n, nb, bytes_per_block)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8 * d
        qs = blocks[..., 4:]
    else:
        zero = np.zeros_like(d)
        qs = blocks[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)   # ggml: low nibbles first, then high
    return Int4Weight(torch.from_numpy(q.astype(np.uint8)), torch.from_numpy(d), torch.from_numpy(zero))


def linear_weight_names(names: set[str]) -> set[str]:
    """The names of the 2-D projection weights inside the decoder layers."""
    parts = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    return {n for n in names if n.startswith("blk.") and n.split(".")[-2] in parts and n.endswith(".weight")}


def quantize_weights(reader: gguf.GGUFReader, weights: dict[str, Any], mode: str,
                     scale_dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Replace (in place) the projection weights and the embedding / LM head with quantized layouts.

    int8: every projection -> Int8Weight. int4: projections -> Int4Weight (exact from Q4_0 / Q4_1 blocks).
    The embedding / head -> HeadWeight (hitenter/quant/head.py): the exact GGUF table (for the embedding
    lookup and the head's rescoring) plus a coarse Int4Weight / Int8Weight for the fast head kernel."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"quantization: must be one of {list(QUANTIZATIONS)}, got {mode!r}")
    if mode == "none":
        return weights
    infos = {t.name: t for t in reader.tensors}
    for name in sorted(linear_weight_names(set(weights))):
        w = weights[name]
        t = infos[name]
        k = int(w.shape[1])
        if mode == "int4" and k % GROUP == 0:
            if t.tensor_type in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1):
                weights[name] = int4_from_gguf_blocks(t.data, t.tensor_type, k)
            else:
                weights[name] = int4_from_float(w)
        else:
            weights[name] = int8_from_float(w, scale_dtype)
    head_name = "output.weight" if "output.weight" in weights else "token_embd.weight"   # tied without output
    for name in ("token_embd.weight", "output.weight"):
        if name in weights:
            w = weights[name]
            coarse = None
            if name == head_name:   # an untied embedding is only looked up: no kernel layout for it
                coarse = int4_from_float(w) if mode == "int4" and w.shape[1] % GROUP == 0 else int8_from_float(w, scale_dtype)
            weights[name] = HeadWeight(coarse, exact_rows_from_gguf(infos[name], w))
    return weights
