"""LFM2's double-gated short convolution (llama.cpp src/models/lfm2.cpp, build_shortconv_block):

    B, C, x = in_proj(h) split in three [T, H] parts (that order)
    y = out_proj(C * conv(B * x))

with conv the depthwise causal convolution of `shortconv.conv` [H, L] (L = shortconv.l_cache taps;
kernels/ssm_scan.py) whose state is the last L - 1 rows of B * x. The generation rows of several sequences
(one row each, no save due) go through the conv together, each with its one-row span's arithmetic. Tensors (llama.cpp's names, under
``blk.{i}.``): shortconv.in_proj [3H, H], shortconv.conv [H, L], shortconv.out_proj [H, H].
"""

from __future__ import annotations

from typing import Any

import torch

from hitenter.config import ModelConfig
from hitenter.models.layers import make_linear
from hitenter.models.recurrent.base import RecurrentMixer, StateCache, for_each_span, single_rows
from hitenter.models.recurrent.causal_conv import causal_conv


def _dense(w: Any) -> torch.Tensor:
    """A small tensor (conv taps, norms, biases) as fp32, dequantized if the file stored it in blocks."""
    return (w if isinstance(w, torch.Tensor) else w.dequantize()).float().contiguous()


class ShortConv(RecurrentMixer):
    """See the module docstring. State: ``conv`` [L - 1, H], the tail of B * x."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], p: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.hidden, self.dtype = cfg.hidden_size, dtype
        self.in_proj = make_linear(w[p + "shortconv.in_proj.weight"], None, dtype)
        self.out_proj = make_linear(w[p + "shortconv.out_proj.weight"], None, dtype)
        self.taps = _dense(w[p + "shortconv.conv.weight"])   # [H, L]
        if self.taps.shape[1] < 2:
            raise ValueError(f"{p}shortconv.conv: needs >= 2 taps, got {self.taps.shape[1]}")

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"conv": (self.taps.shape[1] - 1, self.hidden)}

    def _single_rows(self, rows: list[int], slots: list[int], bx: torch.Tensor, cache: StateCache,
                     y: torch.Tensor) -> None:
        """Generation rows of several sequences at once, each with its one-row span's arithmetic (causal_conv's
        tap-ordered sum of rounded products over [tail ; row], which the native conv computes the same way)."""
        u = torch.cat([cache["conv"][slots], bx[rows][:, None]], 1)   # [N, L, H]
        out = u[:, 0] * self.taps[:, 0]
        for i in range(1, self.taps.shape[1]):
            out = out + u[:, i] * self.taps[:, i]
        cache["conv"][slots] = u[:, 1:]
        y[rows] = out

    def forward(self, h: torch.Tensor, attn: Any, cache: StateCache) -> torch.Tensor:
        b, c, x = self.in_proj(h).float().chunk(3, dim=-1)
        bx = b * x
        y = torch.zeros_like(bx)   # padding rows stay zero

        def run(a: int, e: int, slot: int) -> None:
            y[a:e] = causal_conv(cache["conv"][slot], bx[a:e], self.taps)

        singles = single_rows(attn)
        if len(singles) > 1:
            self._single_rows([attn.query_start_loc[i] for i in singles], [attn.state_slots[i] for i in singles],
                              bx, cache, y)
        for_each_span(attn, cache, run, skip=set(singles) if len(singles) > 1 else ())
        return self.out_proj((c * y).to(self.dtype))
