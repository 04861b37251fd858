"""A mixture's expert weights: GGUF 3-D expert tensors kept as the file's blocks, and their modules.

llama.cpp stores each projection of a layer's experts as one 3-D tensor (`blk.N.ffn_{gate,up,down}_exps.weight`,
ggml ne = [in, out, n_expert], torch order [E, out, in]). `expert_weights(reader, name)` wraps it as an
`ExpertWeight`: a native block type (hitenter.kernels.BLOCK_TYPES) stays the file's bytes (one BlockWeight
over all experts' rows, [E * out, in], expert e's rows contiguous; a view of the map, no copy); anything
else (F32/F16/BF16, types without a kernel), or everything with `dense=True`, is dequantized to fp32
[E, out, in]. `dense_experts(t)` builds the dense form from an fp32 tensor (float32 loads, tests).

Ownership (what the model layer does at load: nothing new). `expert_linear` makes one module per expert
and projection: an `ExpertLinear` (a BlockLinear subclass) over the expert's block rows, or a dense fp32
`Linear`. `own_block_bytes(model)` (models/block_linear.py, already called by the loader) finds the
ExpertLinears as it finds every BlockLinear, copies their parts into the weight arena (repacking
Q4_0/Q4_1/Q8_0 where the kernel does) and hands them back through `set_parts`; `drop_mapped_pages` then
releases the map. The arena places a module's parts back to back, so an expert's gate and up (two file
tensors, two qmatmul calls before ownership) become one BlockWeight (`adjacent_rows`): one qmatmul for
both afterwards, with the same bits.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import gguf
import numpy as np
import torch
from torch import nn

from hitenter.errors import ModelLoadError
from hitenter.kernels import BLOCK_TYPES, BlockWeight, qmatmul
from hitenter.models.block_linear import BlockLinear
from hitenter.models.gguf import SUPPORTED_TENSOR_TYPES
from hitenter.models.linear import Linear

Weight = BlockWeight | torch.Tensor


@dataclass
class ExpertWeight:
    """One projection of E experts, each [out, in]: `blocks` ([E * out, in], expert e at rows
    e * out ...) or `dense` (fp32 [E, out, in]); exactly one is set."""

    n_expert: int
    out_features: int
    in_features: int
    blocks: BlockWeight | None = None
    dense: torch.Tensor | None = None

    def expert(self, e: int) -> Weight:
        """Expert e's [out, in] rows: a BlockWeight narrow or a tensor view (no copy)."""
        if not 0 <= e < self.n_expert:
            raise IndexError(f"expert {e} out of range for {self.n_expert} experts")
        if self.blocks is not None:
            return self.blocks.narrow(0, e * self.out_features, self.out_features)
        return self.dense[e]

    def dequantize(self) -> torch.Tensor:
        """fp32 [E, out, in] (the dense tensor itself, or the blocks' exact values)."""
        if self.dense is not None:
            return self.dense
        return self.blocks.dequantize().view(self.n_expert, self.out_features, self.in_features)


def dense_experts(t: torch.Tensor) -> ExpertWeight:
    """An ExpertWeight over an fp32 [E, out, in] tensor (made contiguous fp32, shared where it already is)."""
    if t.dim() != 3:
        raise ValueError(f"dense_experts: expected [E, out, in], got {tuple(t.shape)}")
    e, n, k = t.shape
    return ExpertWeight(e, n, k, dense=t.float().contiguous())


def expert_weights(reader: gguf.GGUFReader, name: str, dense: bool = False) -> ExpertWeight:
    """The 3-D expert tensor `name` of an open GGUF (ggml ne [in, out, E]): block types as the file's
    bytes (a view of the map), others (or all, with `dense`) dequantized to fp32. ModelLoadError when
    it is missing, not 3-D, past the end of the file or of a type the loader does not read."""
    t = next((t for t in reader.tensors if t.name == name), None)
    if t is None:
        raise ModelLoadError(f"missing expert tensor {name!r}")
    if len(t.shape) != 3:
        raise ModelLoadError(f"expert tensor {name!r} has {len(t.shape)} dims, expected 3 (in, out, experts)")
    if t.data_offset + t.n_bytes > len(reader.data) or t.data.nbytes != t.n_bytes:
        raise ModelLoadError(f"tensor {name!r} lies beyond the end of the file: the file is truncated or corrupt")
    k, n, e = (int(d) for d in t.shape)
    qtype = int(t.tensor_type)
    if qtype in BLOCK_TYPES and not dense:
        raw = np.asarray(t.data).view(np.uint8).reshape(e * n, -1)
        with warnings.catch_warnings():   # a read-only map viewed by torch: never written, copied at ownership
            warnings.simplefilter("ignore", UserWarning)
            return ExpertWeight(e, n, k, blocks=BlockWeight(torch.from_numpy(raw), qtype, (e * n, k)))
    if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
        raise ModelLoadError(f"expert tensor {name!r} uses the unsupported GGML type {t.tensor_type.name}")
    arr = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(e, n, k)
    return ExpertWeight(e, n, k, dense=torch.from_numpy(np.array(arr, dtype=np.float32, order="C")))


def adjacent_rows(parts: list[BlockWeight]) -> BlockWeight | None:
    """One BlockWeight over `parts` when they are one type and lie back to back in one storage (the
    arena puts a module's parts so), else None. Same values, one qmatmul instead of len(parts)."""
    p0 = parts[0]
    if len(parts) < 2 or any(p.qtype != p0.qtype or p.lanes != p0.lanes for p in parts):
        return None
    if any(not p.data.is_contiguous() or p.data.untyped_storage().data_ptr() != p0.data.untyped_storage().data_ptr()
           for p in parts):
        return None
    end = p0.data.data_ptr()
    for p in parts:
        if p.data.data_ptr() != end:
            return None
        end += p.data.numel()
    n = sum(p.shape[0] for p in parts)
    shape = (p0.data.numel() + sum(p.data.numel() for p in parts[1:]),) if p0.lanes else (n, p0.data.shape[1])
    data = torch.empty(0, dtype=torch.uint8).set_(p0.data.untyped_storage(), p0.data.storage_offset(), shape)
    try:
        return BlockWeight(data, p0.qtype, (n, p0.shape[1]), p0.lanes)
    except ValueError:   # repacked parts whose rows do not fill whole lane groups
        return None


class ExpertLinear(BlockLinear):
    """A BlockLinear that runs adjacent same-type parts (an owned expert's gate and up) as one qmatmul."""

    def set_parts(self, parts: list[BlockWeight]) -> None:
        """Hold `parts`; `fused` is their one BlockWeight when adjacent, `one` what runs the module in a
        single qmatmul (the fused weight or the only part; None: one call per part)."""
        super().set_parts(parts)
        self.fused = adjacent_rows(self.parts)
        self.one = self.fused if self.fused is not None or len(self.parts) > 1 else self.parts[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.one is None else qmatmul(x, self.one)


def expert_linear(ws: list[Weight]) -> nn.Module:
    """One module for projections of one expert that share an input (gate, up: outputs side by side):
    an ExpertLinear over blocks (no copy), else a dense fp32 Linear (blocks dequantized if mixed)."""
    if all(isinstance(w, BlockWeight) for w in ws):
        return ExpertLinear(list(ws))
    dense = [w.dequantize() if isinstance(w, BlockWeight) else w for w in ws]
    return Linear(dense[0] if len(dense) == 1 else torch.cat(dense), None, torch.float32)
