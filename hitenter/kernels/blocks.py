"""GGUF block-quantized weights held as the file stores them.

A GGUF tensor of shape `[N, K]` (torch order; the file lists it as `(K, N)`) in a block type is N rows,
each row `K / block_elems` blocks of `block_bytes` bytes. Blocks never cross rows, so any row subset or
row concatenation of one type is again a valid tensor: that is all the model build needs (fused Q/K/V,
gate/up, llama's Q/K row un-permutation, tensor-parallel column shards).
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
# types kept as blocks and run natively: (elements per block, bytes per block), from gguf's own table
BLOCK_TYPES: dict[int, tuple[int, int]] = {
    int(t): gguf.GGML_QUANT_SIZES[t]
    for t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)
}


@dataclass
class BlockWeight:
    """`[N, K]` weight: `data` uint8 `[N, K / block_elems * block_bytes]`, rows of GGUF blocks of `qtype`."""

    data: torch.Tensor
    qtype: int
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        elems, nbytes = BLOCK_TYPES[self.qtype]
        n, k = self.shape
        if k % elems or tuple(self.data.shape) != (n, k // elems * nbytes) or self.data.dtype != torch.uint8:
            raise ValueError(f"BlockWeight: data {tuple(self.data.shape)} {self.data.dtype} does not hold "
                             f"{Q(self.qtype).name} rows of shape {self.shape}")

    @property
    def type_name(self) -> str:
        return Q(self.qtype).name

    def nbytes(self) -> int:
        return self.data.numel()

    def narrow(self, dim: int, start: int, length: int) -> BlockWeight:
        if dim == 0:
            return BlockWeight(self.data.narrow(0, start, length), self.qtype, (length, self.shape[1]))
        if start == 0 and length == self.shape[1]:
            return self
        raise NotImplementedError("block-quantized weights cannot be split along their input dimension")

    def index_rows(self, index: torch.Tensor) -> BlockWeight:
        return BlockWeight(self.data.index_select(0, index).contiguous(), self.qtype,
                           (int(index.numel()), self.shape[1]))

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 `[N, K]` (or just `rows`), exactly the file's values (gguf's reference dequantizer)."""
        data = self.data if rows is None else self.data.index_select(0, rows)
        out = gguf.quants.dequantize(data.numpy(), Q(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(data.shape[0], self.shape[1])


def cat_block_rows(ws: list[BlockWeight]) -> BlockWeight:
    """Rows of several weights of one type and input size, in order (one copy)."""
    if len({w.qtype for w in ws}) != 1 or len({w.shape[1] for w in ws}) != 1:
        raise ValueError("cat_block_rows: weights differ in block type or input size")
    data = torch.cat([w.data for w in ws])
    return BlockWeight(data, ws[0].qtype, (int(data.shape[0]), ws[0].shape[1]))


def block_weight_from_gguf(tensor: gguf.ReaderTensor) -> BlockWeight:
    """A GGUF reader tensor of a block type as a BlockWeight over the file's bytes (memory-mapped, no copy)."""
    qtype = int(tensor.tensor_type)
    if qtype not in BLOCK_TYPES:
        raise ValueError(f"{tensor.name}: type {tensor.tensor_type.name} is not a native block type")
    k, n = (int(d) for d in tensor.shape[:2])   # GGUF lists dims innermost first
    raw = np.asarray(tensor.data).view(np.uint8).reshape(n, -1)
    return BlockWeight(torch.from_numpy(raw), qtype, (n, k))
