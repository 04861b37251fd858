"""DeepStack (Qwen3-VL): an image's rows arrive from the vision encoder as [K, hidden x (1 + n)], the
embeddings then n blocks; the text model takes the embeddings in place of the rows' token embeddings and
adds block i to the rows' hidden states after layer i (i < n), as llama.cpp's qwen3vl graph does
(src/models/qwen3vl.cpp: the input embedding's slice i + 1 added to the output of layer i; text rows carry
zeros there, so only image rows change).

Contract: split(values, hidden, n) -> (embeddings [K, hidden], blocks [n, K, hidden]); run_layers runs a
model's layers one by one (each row on its own path, the same bits as the whole-step routing) adding the
blocks to `rows` after the first n layers.
"""

from __future__ import annotations

from typing import Any

import torch


def split(values: torch.Tensor, hidden: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An image's rows -> (embeddings, DeepStack blocks); ValueError unless the width is hidden x (1 + n)."""
    if values.ndim != 2 or values.shape[1] != hidden * (1 + n):
        raise ValueError(f"image rows of shape {tuple(values.shape)}: expected [K, {hidden * (1 + n)}] "
                         f"(hidden {hidden} x (1 + {n} DeepStack blocks))")
    parts = values.view(values.shape[0], 1 + n, hidden).transpose(0, 1)
    return parts[0], parts[1:]


def run_layers(model: Any, x: torch.Tensor, attn: Any, kv_caches: list[torch.Tensor],
               layer_ropes: list[tuple[Any, Any]], n: int, rows: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Every layer on the step's rows x [T, H], blocks[i] added to x[rows] after layer i."""
    for i, (layer, cache, (rope, cos_sin)) in enumerate(zip(model.layers, kv_caches, layer_ropes, strict=True)):
        x = layer(x, rope, cos_sin, attn, cache, n)
        if i < blocks.shape[0]:
            x = x.index_add(0, rows, blocks[i].to(x.dtype))
    return x
