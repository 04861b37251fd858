"""GGUF block-quantized weights held as the file stores them.

A GGUF tensor of shape `[N, K]` (torch order; the file lists it as `(K, N)`) in a block type is N rows,
each row `K / block_elems` blocks of `block_bytes` bytes. Blocks never cross rows, so any row subset or
row concatenation of one type is again a valid tensor: that is all the model build needs (fused Q/K/V,
gate/up, llama's Q/K row un-permutation, tensor-parallel column shards).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
# types kept as blocks and run natively: (elements per block, bytes per block), from gguf's own table
BLOCK_TYPES: dict[int, tuple[int, int]] = {
    int(t): gguf.GGML_QUANT_SIZES[t]
    for t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
              Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4)
}
# repacked layout (csrc/qmatmul/qm_repack.h): bytes per row and 32-element block (quants, fp16 d, fp16 m for Q4_*)
REPACK_ROW_BYTES: dict[int, int] = {int(Q.Q4_0): 20, int(Q.Q4_1): 20, int(Q.Q8_0): 34}


@dataclass
class BlockWeight:
    """`[N, K]` weight: `data` uint8 `[N, K / block_elems * block_bytes]`, rows of GGUF blocks of `qtype`.

    `lanes > 0`: repacked at load for the native kernel (hitenter.kernels.qmatmul.repack; csrc/qmatmul/qm_repack.h):
    `data` is then 1-D, groups of `lanes` rows side by side; only qmatmul and `dequantize` read it."""

    data: torch.Tensor
    qtype: int
    shape: tuple[int, int]
    lanes: int = 0
    _lane_bytes: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    # of a meta placeholder (a weight-cache build, hitenter/models/weight_cache.py): the file's weight it
    # stands for, which `dequantize` / `file_rows` read (a router dequantized while the model is built)
    source: BlockWeight | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        elems, nbytes = BLOCK_TYPES[self.qtype]
        n, k = self.shape
        if self.lanes:
            want = (n + self.lanes - 1) // self.lanes * self.lanes * (k // elems) * REPACK_ROW_BYTES.get(self.qtype, 0)
            if k % elems or self.data.dim() != 1 or self.data.numel() != want or self.data.dtype != torch.uint8:
                raise ValueError(f"BlockWeight: data {tuple(self.data.shape)} {self.data.dtype} does not hold "
                                 f"{Q(self.qtype).name} {self.shape} repacked by {self.lanes} rows")
            return
        if k % elems or tuple(self.data.shape) != (n, k // elems * nbytes) or self.data.dtype != torch.uint8:
            raise ValueError(f"BlockWeight: data {tuple(self.data.shape)} {self.data.dtype} does not hold "
                             f"{Q(self.qtype).name} rows of shape {self.shape}")

    @property
    def type_name(self) -> str:
        return Q(self.qtype).name

    def nbytes(self) -> int:
        return self.data.numel()

    def narrow(self, dim: int, start: int, length: int) -> BlockWeight:
        self._rows_only("narrow")
        if dim == 0:
            return BlockWeight(self.data.narrow(0, start, length), self.qtype, (length, self.shape[1]))
        if start == 0 and length == self.shape[1]:
            return self
        raise NotImplementedError("block-quantized weights cannot be split along their input dimension")

    def _rows_only(self, what: str) -> None:
        if self.lanes:
            raise NotImplementedError(f"{what}: a repacked weight has no rows (repack after building the model)")

    def index_rows(self, index: torch.Tensor) -> BlockWeight:
        self._rows_only("index_rows")
        if self.data.is_meta:
            return BlockWeight(_placeholder(int(index.numel()), int(self.data.shape[1])), self.qtype,
                               (int(index.numel()), self.shape[1]))
        return BlockWeight(self.data.index_select(0, index).contiguous(), self.qtype,
                           (int(index.numel()), self.shape[1]))

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 `[N, K]` (or just `rows`), exactly the file's values (gguf's reference dequantizer; for `rows`,
        an embedding lookup, its type's block formulas called directly: through `gguf.quants.dequantize` a
        decode step's one-row lookup would cost far more in wrapper than in arithmetic)."""
        if self.source is not None:
            return self.source.dequantize(rows)
        data = self.file_rows(rows)
        blocks = getattr(gguf.quants, Q(self.qtype).name, None) if rows is not None else None
        if blocks is not None and hasattr(blocks, "dequantize_blocks"):
            out = blocks.dequantize_blocks(data.numpy().reshape(-1, BLOCK_TYPES[self.qtype][1]))
        else:
            out = gguf.quants.dequantize(data.numpy(), Q(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(data.shape[0], self.shape[1])

    def file_rows(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The file's rows `[N, K / block_elems * block_bytes]` (or just `rows`, in that order); of a repacked
        weight the repacking undone, for `rows` reading only their bytes (a tied embedding's lookups)."""
        if self.source is not None:
            return self.source.file_rows(rows)
        if not self.lanes:
            return self.data if rows is None else self.data.index_select(0, rows)
        n, k = self.shape
        nb, ln, qt = k // 32, self.lanes, self.qtype
        group = nb * REPACK_ROW_BYTES[qt] * ln
        if rows is not None:   # a gather of each row's bytes: lane offsets within its group, worked out once
            if self._lane_bytes is None:
                where = _unrepack(np.arange(group, dtype=np.int64).reshape(1, nb, -1), qt, nb, ln, np.arange(ln))
                self._lane_bytes = np.ascontiguousarray(where.reshape(ln, -1))
            r = rows.numpy().astype(np.int64)
            out = self.data.numpy()[(r // ln * group)[:, None] + self._lane_bytes[r % ln]]
            return torch.from_numpy(_unsign(out.reshape(len(r), nb, -1), qt).reshape(len(r), -1))
        blocks = np.ascontiguousarray(_unrepack(self.data.numpy().reshape(-1, nb, group // nb), qt, nb, ln, None)[:n])
        return torch.from_numpy(_unsign(blocks, qt).reshape(n, -1))


def _unrepack(groups: np.ndarray, qt: int, nb: int, ln: int, pick: np.ndarray | None) -> np.ndarray:
    """`[rows, nb, block_bytes]`: the file-order blocks of repacked `groups` `[groups, nb, lanes * row_bytes]`
    (csrc/qmatmul/qm_repack.h), all rows or the rows `pick`; Q8_0's quants still + 128 (`_unsign`). Any element type:
    run on byte positions it says where each byte of a row lies."""
    order = [b for ph in range(4) for b in range(ph, nb, 4)]        # blocks as stored: b % 4, then b / 4
    inv = np.argsort(order)
    nq = 8 if qt == int(Q.Q8_0) else 4                 # quant vectors per block: [nq, lanes, 4] bytes

    def lanes_of(a: np.ndarray, width: int) -> np.ndarray:
        """[groups, nb, lanes, ...width] (views of the groups' bytes) -> [rows, nb, width] in block order; for
        `pick` only those rows' bytes are copied"""
        if pick is None:
            return a[:, inv].transpose(0, 2, 1, *range(3, a.ndim)).reshape(-1, nb, width)
        return a[pick // ln, :, pick % ln][:, inv]

    q = lanes_of(groups[..., :nq * ln * 4].reshape(-1, nb, nq, ln, 4).transpose(0, 1, 3, 2, 4), nq * 4)
    q = q.reshape(q.shape[0], nb, nq * 4)
    d = lanes_of(groups[..., nq * ln * 4:nq * ln * 4 + 2 * ln].reshape(-1, nb, ln, 2), 2)
    if qt == int(Q.Q4_1):
        m = lanes_of(groups[..., nq * ln * 4 + 2 * ln:].reshape(-1, nb, ln, 2), 2)
        return np.concatenate([d, m, q], axis=-1)
    return np.concatenate([d, q], axis=-1)


def _unsign(blocks: np.ndarray, qt: int) -> np.ndarray:
    """Q8_0 blocks `[..., 34]` as repacked (quants + 128) back to the file's bytes; other types as they are."""
    if qt == int(Q.Q8_0):
        blocks[..., 2:] ^= 0x80
    return blocks


def cat_block_rows(ws: list[BlockWeight]) -> BlockWeight:
    """Rows of several weights of one type and input size, in order (one copy)."""
    if len({w.qtype for w in ws}) != 1 or len({w.shape[1] for w in ws}) != 1 or any(w.lanes for w in ws):
        raise ValueError("cat_block_rows: weights differ in block type or input size, or are repacked")
    if any(w.data.is_meta for w in ws):   # placeholders (a cached arena's build): the shape, nothing to copy
        data = _placeholder(sum(int(w.data.shape[0]) for w in ws), int(ws[0].data.shape[1]))
    else:
        data = torch.cat([w.data for w in ws])
    return BlockWeight(data, ws[0].qtype, (int(data.shape[0]), ws[0].shape[1]))


def _placeholder(rows: int, row_bytes: int) -> torch.Tensor:
    """A meta tensor of uint8 [rows, row_bytes], made without torch's Python meta kernels (whose first use
    imports torch._dynamo: seconds)."""
    return torch.empty((rows, row_bytes), dtype=torch.uint8, device="meta")


def block_weight_from_gguf(tensor: gguf.ReaderTensor) -> BlockWeight:
    """A GGUF reader tensor of a block type as a BlockWeight over the file's bytes (memory-mapped, no copy)."""
    qtype = int(tensor.tensor_type)
    if qtype not in BLOCK_TYPES:
        raise ValueError(f"{tensor.name}: type {tensor.tensor_type.name} is not a native block type")
    k, n = (int(d) for d in tensor.shape[:2])   # GGUF lists dims innermost first
    raw = np.asarray(tensor.data).view(np.uint8).reshape(n, -1)
    return BlockWeight(torch.from_numpy(raw), qtype, (n, k))
