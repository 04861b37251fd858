"""The embedding and LM head of a quantized model: exact GGUF rows, and a rescored quantized head.

Why: torch's quantized CPU kernels are fast only with bfloat16 activations and then return bfloat16,
so a quantized LM head's logits are rounded to 8 mantissa bits (a logit of 20 to steps of 0.125).
That rounding alone creates near-ties that flip greedy choices against the fp32 model. Instead:

* `ExactRows` keeps the GGUF table's exact values compactly (Q8_0: the int8 values and the per-32
  block scales, whose products are exact in fp32; F16: fp16; anything else: fp32) and materializes
  rows on demand.
* `ExactEmbedding` looks token ids up in it (the same values as the fp32 model's embedding).
* `RescoredHead` computes coarse logits with the fast quantized kernel, then recomputes each row's
  top-`k` candidates exactly (float64 dot products with the exact rows, rounded once to fp32), so the
  tokens that can win greedy / top-k / top-p sampling carry fp32-accurate logits. Everything is per
  row, so results stay batch invariant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
import torch
from torch import nn

Q8_0_BLOCK = 32
Q8_0_BYTES = 34   # fp16 scale + 32 int8 values


class ExactRows(nn.Module):
    """A [N, K] table stored as `values` (int8 / fp16 / fp32) times optional per-32 block `scales`."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("values", values.contiguous())
        self.register_buffer("scales", None if scales is None else scales.contiguous())
        self.shape = (int(values.shape[0]), int(values.shape[1]))

    def rows(self, idx: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The exact rows `idx` (LongTensor [n]) as `[n, K]` in dtype (fp32 or wider: exact)."""
        r = self.values.index_select(0, idx).to(dtype)
        if self.scales is None:
            return r
        s = self.scales.index_select(0, idx).to(dtype)
        return (r.view(len(idx), -1, Q8_0_BLOCK) * s.unsqueeze(-1)).view(len(idx), -1)


def exact_rows_from_gguf(tensor: Any, dequantized: torch.Tensor) -> ExactRows:
    """The compact exact table of a GGUF tensor (`tensor` from gguf.GGUFReader; `dequantized` its fp32 values)."""
    n, k = dequantized.shape
    if tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0 and k % Q8_0_BLOCK == 0:
        blocks = np.ascontiguousarray(tensor.data).reshape(n, k // Q8_0_BLOCK, Q8_0_BYTES)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = blocks[..., 2:].copy().view(np.int8).reshape(n, k)
        return ExactRows(torch.from_numpy(q), torch.from_numpy(d))
    if tensor.tensor_type == gguf.GGMLQuantizationType.F16:
        return ExactRows(dequantized.to(torch.float16))
    return ExactRows(dequantized.float())


@dataclass
class HeadWeight:
    """A quantized embedding / LM head table: `coarse` (an Int4Weight / Int8Weight for the fast kernel; None
    for an untied embedding, which is only looked up) and `exact` (the GGUF values)."""

    coarse: Any
    exact: ExactRows

    @property
    def shape(self) -> tuple[int, int]:
        return self.exact.shape


class ExactEmbedding(nn.Module):
    """Token embedding lookup in the exact table (same values as the fp32 model's embedding)."""

    def __init__(self, exact: ExactRows, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.exact = exact
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.exact.rows(ids.reshape(-1)).view(*ids.shape, -1).to(self.dtype)


class RescoredHead(nn.Module):
    """fp32 logits `[N, V]`: the coarse quantized head, with each row's top-k recomputed exactly."""

    def __init__(self, coarse: nn.Module, exact: ExactRows, k: int = 32) -> None:
        super().__init__()
        if k <= 0:
            raise ValueError(f"RescoredHead: k must be > 0, got {k}")
        self.coarse = coarse
        self.exact = exact
        self.k = min(k, exact.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.coarse(x).float()
        n = x.shape[0]
        top = logits.topk(self.k, dim=-1).indices                         # [N, k]
        w = self.exact.rows(top.reshape(-1), torch.float64).view(n, self.k, -1)
        exact = (w * x.to(torch.float64).unsqueeze(1)).sum(-1)             # [N, k], one rounding to fp32
        return logits.scatter_(1, top, exact.to(torch.float32))
