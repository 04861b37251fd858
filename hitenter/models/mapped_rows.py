"""Tables read by rows from the model file's memory map, never copied whole (Gemma 4's per-layer token table:
vocab x layers x 256 values, 2.3 G on E2B): `mapped_table(tensor)` views a GGUF tensor in place (F32 / F16 /
BF16 elements as a torch view of the map, a native block type as a BlockWeight over its bytes), and
`MappedRows(table)(ids)` returns the rows of those ids as fp32, each distinct row converted once. The view
is not a parameter or buffer: what it costs is the pages its lookups touch, not the table
(drop_mapped_pages after the load releases the rest)."""

from __future__ import annotations

import warnings
from typing import Any

import gguf
import numpy as np
import torch
from torch import nn

from hitenter.errors import ModelLoadError
from hitenter.kernels.blocks import BLOCK_TYPES, BlockWeight, block_weight_from_gguf

_ELEMENTS = {gguf.GGMLQuantizationType.F32: torch.float32, gguf.GGMLQuantizationType.F16: torch.float16,
             gguf.GGMLQuantizationType.BF16: torch.bfloat16}


def mapped_table(t: Any) -> torch.Tensor | BlockWeight:
    """GGUF reader tensor `t` ([rows, width] in torch order) over the file's map, without a copy; ModelLoadError
    for another type or a tensor past the end of the file."""
    if len(t.shape) != 2 or t.data.nbytes != t.n_bytes:
        raise ModelLoadError(f"tensor {t.name!r}: a row table must be 2-D and inside the file")
    if int(t.tensor_type) in BLOCK_TYPES:
        with warnings.catch_warnings():   # a read-only map viewed by torch: never written
            warnings.simplefilter("ignore", UserWarning)
            return block_weight_from_gguf(t)
    dtype = _ELEMENTS.get(t.tensor_type)
    if dtype is None:
        raise ModelLoadError(f"tensor {t.name!r}: type {t.tensor_type.name} is not supported for a row table")
    width, rows = (int(d) for d in t.shape[:2])   # GGUF lists dims innermost first
    raw = np.asarray(t.data).view(np.uint8).reshape(rows, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(raw).view(dtype).view(rows, width)


class MappedRows(nn.Module):
    """Row lookup over a mapped table (module docstring): `forward(ids)` -> fp32 `[*ids.shape, width]`."""

    def __init__(self, table: torch.Tensor | BlockWeight) -> None:
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).long()
        uniq, inverse = torch.unique(flat, return_inverse=True)
        if isinstance(self.table, BlockWeight):
            rows = self.table.dequantize(uniq)
        else:
            rows = self.table.index_select(0, uniq).float()
        return rows.index_select(0, inverse).view(*ids.shape, self.embedding_dim)
