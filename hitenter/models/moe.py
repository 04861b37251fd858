"""Mixture-of-experts feed-forward (Mixtral, Qwen2/3-MoE, OLMoE, ...) on the GGUF's own expert blocks.

Weights. llama.cpp stores each projection of a layer's experts as one 3-D tensor
(`blk.N.ffn_{gate,up,down}_exps.weight`, ggml ne = [in, out, n_expert], torch order [E, out, in]).
`expert_weights(reader, name)` wraps it as an `ExpertWeight`: a native block type stays the file's bytes
(one BlockWeight over all experts' rows, [E * out, in], expert e's rows contiguous; a view of the map, no
copy), anything else (F32/F16/BF16, types without a kernel) is dequantized to fp32 [E, out, in].
`dense_experts(t)` builds the dense form from an fp32 tensor (float32 reference loads, tests).

Owning the bytes (what the model layer does at load): nothing beyond what it already does. MoEFFN holds
one `ExpertLinear` (a BlockLinear) per expert for gate+up (two parts, the file's two tensors) and one
for down, so `own_block_bytes(model)` copies them into the weight arena with every other BlockLinear
(repacking Q4_0/Q4_1/Q8_0 where the kernel does), then `drop_mapped_pages` releases the map as for a
dense model. The arena places an expert's gate rows right before its up rows; `ExpertLinear.set_parts`
sees that and runs gate+up as ONE qmatmul over both (before ownership: two calls, same bits).
Dense experts are `Linear` modules (oneDNN-packed where row invariant), owned by the module itself.

Routing (llama.cpp's build_moe_ffn order): logits = x router^T (+ router_bias, ffn_gate_inp.bias);
probs = softmax over all experts ("softmax"), sigmoid ("sigmoid") or the logits ("softmax_weight");
top-k of probs (+ selection_bias, DeepSeek's exp_probs_b, for the choice only), ties to the lower
expert index; weights = the chosen probs (softmax over the k for "softmax_weight"), divided by their
sum when norm_topk (summed in order, clamped at 2^-14 as llama.cpp does), times weights_scale when given.
y = sum over ranks k = 0..K-1, in that order, of w_k * down_e(act(gate_e x) * up_e x).

Grouped execution: the rows routed to each active expert are gathered and run through one qmatmul per
projection (gate+up fused, down); each (row, rank) result is scaled by its weight and copied to its
own slot, then the K slots of a row are added in rank order. Batch invariance: the block kernels give a
row the same bits for any M; dense GEMMs (the router, dense experts, blocks on the torch reference
path) get row counts padded to a multiple of 8 (llama.py's pad_rows); every other op is elementwise
or per row, so a row's output bits do not depend on the other rows, nor on which path (T = 1 or grouped).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import gguf
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.kernels import BLOCK_TYPES, BlockWeight, qmatmul
from hitenter.models.block_linear import BlockLinear
from hitenter.models.linear import Linear

ROW_MULTIPLE = 8                   # as llama.py / attention.py: dense GEMM row counts padded to this
WEIGHTS_SUM_MIN = 6.103515625e-5   # llama.cpp clamps the top-k weights' sum here (smallest normal fp16)
GATINGS = ("softmax", "sigmoid", "softmax_weight")
ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu}
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
    it is missing, not 3-D or past the end of the file."""
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
        super().set_parts(parts)
        self.fused = adjacent_rows(self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return qmatmul(x, self.fused)
        if len(self.parts) == 1:
            return qmatmul(x, self.parts[0])
        return super().forward(x)


def expert_linear(ws: list[Weight]) -> nn.Module:
    """One module for projections of one expert that share an input (gate, up: outputs side by side):
    an ExpertLinear over blocks (no copy), else a dense fp32 Linear (blocks dequantized if mixed)."""
    if all(isinstance(w, BlockWeight) for w in ws):
        return ExpertLinear(list(ws))
    dense = [w.dequantize() if isinstance(w, BlockWeight) else w for w in ws]
    return Linear(dense[0] if len(dense) == 1 else torch.cat(dense), None, torch.float32)


def pad_rows(x: torch.Tensor, multiple: int = ROW_MULTIPLE) -> torch.Tensor:
    """x with zero rows appended up to a multiple of `multiple` rows (x itself if it is one)."""
    r = (-x.shape[0]) % multiple
    return x if r == 0 else torch.cat([x, x.new_zeros((r,) + tuple(x.shape[1:]))])


def _needs_padding(m: nn.Module) -> bool:
    return isinstance(m, Linear) or bool(getattr(m, "needs_row_padding", False))


def _check_experts(gate: ExpertWeight, up: ExpertWeight, down: ExpertWeight, router: torch.Tensor) -> None:
    e, h = router.shape
    if {gate.n_expert, up.n_expert, down.n_expert} != {e}:
        raise ValueError(f"MoEFFN: router has {e} experts, projections {gate.n_expert}/{up.n_expert}/{down.n_expert}")
    f = gate.out_features
    if (gate.in_features, up.in_features, up.out_features, down.in_features, down.out_features) != (h, h, f, f, h):
        raise ValueError(f"MoEFFN: shapes gate {gate.out_features}x{gate.in_features}, up {up.out_features}x"
                         f"{up.in_features}, down {down.out_features}x{down.in_features} do not fit hidden {h}")


class MoEFFN(nn.Module):
    """y [T, H] = the mixture of the top-k experts for each row of x [T, H] (fp32); see the module doc.

    `forward(x, n_real)`: only the first n_real rows (default all) are routed; rows past it (a model's
    padding) come back zero."""

    def __init__(self, router: torch.Tensor, gate: ExpertWeight, up: ExpertWeight, down: ExpertWeight,
                 top_k: int, norm_topk: bool, gating: str = "softmax", act: str = "silu",
                 router_bias: torch.Tensor | None = None, selection_bias: torch.Tensor | None = None,
                 weights_scale: float | None = None) -> None:
        super().__init__()
        if gating not in GATINGS or act not in ACTS:
            raise ValueError(f"MoEFFN: gating {gating!r} / act {act!r}; known {GATINGS} / {sorted(ACTS)}")
        _check_experts(gate, up, down, router)
        if not 0 < top_k <= router.shape[0]:
            raise ValueError(f"MoEFFN: top_k {top_k} for {router.shape[0]} experts")
        self.n_expert, self.hidden = router.shape
        self.ffn = gate.out_features
        self.top_k, self.norm_topk, self.gating, self.act = top_k, norm_topk, gating, ACTS[act]
        self.weights_scale = weights_scale
        self.router = nn.Parameter(router.float().contiguous(), requires_grad=False)
        self.router_bias = None if router_bias is None else nn.Parameter(router_bias.float(), requires_grad=False)
        self.selection_bias = (None if selection_bias is None
                               else nn.Parameter(selection_bias.float(), requires_grad=False))
        self.gate_up = nn.ModuleList(expert_linear([gate.expert(e), up.expert(e)]) for e in range(self.n_expert))
        self.down = nn.ModuleList(expert_linear([down.expert(e)]) for e in range(self.n_expert))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [T, K] by rank, fp32 weights [T, K]) for x [T, H]; per row, batch invariant."""
        n = x.shape[0]
        logits = F.linear(pad_rows(x), self.router)[:n]   # a dense GEMM: row count padded
        if self.router_bias is not None:
            logits = logits + self.router_bias
        probs = {"softmax": lambda: torch.softmax(logits, dim=-1), "sigmoid": lambda: torch.sigmoid(logits),
                 "softmax_weight": lambda: logits}[self.gating]()
        select = probs if self.selection_bias is None else probs + self.selection_bias
        # a stable descending sort: equal scores keep index order, so a tie goes to the lower expert
        idx = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :self.top_k]
        w = probs.gather(1, idx)
        if self.gating == "softmax_weight":
            w = torch.softmax(w, dim=-1)
        if self.norm_topk:   # cumsum: each row summed in order (in double on CPU), whatever T
            w = w / w.cumsum(dim=-1)[:, -1:].clamp(min=WEIGHTS_SUM_MIN)
        if self.weights_scale is not None:
            w = w * self.weights_scale
        return idx, w

    def expert_ffn(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x [n, H] -> [n, H]: down(act(gate x) * up x), padded where a GEMM needs it."""
        n = x.shape[0]
        gu, down = self.gate_up[e], self.down[e]
        h = gu(pad_rows(x) if _needs_padding(gu) else x)
        a = self.act(h[:, :self.ffn]).mul_(h[:, self.ffn:])
        return down(pad_rows(a) if _needs_padding(down) else a)[:n]

    def forward(self, x: torch.Tensor, n_real: int | None = None) -> torch.Tensor:
        t = x.shape[0]
        n = t if n_real is None else n_real
        x = x.float()
        out = x.new_zeros(t, self.hidden) if n < t else None
        if n == 0:
            return x.new_zeros(t, self.hidden)
        idx, w = self.route(x[:n])
        acc = self._decode_row(x, idx, w) if n == 1 else self._grouped(x[:n], idx, w)
        if out is None:
            return acc
        out[:n] = acc
        return out

    def _decode_row(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """One row: its experts in rank order, each output times its weight, added as they come (the
        same operations per row as `_grouped`, so the same bits)."""
        acc = None
        for r, e in enumerate(idx[0].tolist()):
            o = self.expert_ffn(e, x[:1]).mul_(w[:, r:r + 1])
            acc = o if acc is None else acc.add_(o)
        return acc

    def _grouped(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Rows grouped by expert (one call per projection per active expert); each (row, rank) result
        times its weight lands in its own slot, then a row's K slots are added in rank order."""
        n, k = idx.shape
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        w_flat = w.reshape(-1, 1)
        slots = x.new_empty(n * k, self.hidden)
        start = 0
        for e, c in enumerate(torch.bincount(flat, minlength=self.n_expert).tolist()):
            if c == 0:
                continue
            sel = order[start:start + c]
            start += c
            ye = self.expert_ffn(e, x.index_select(0, sel // k))
            slots.index_copy_(0, sel, ye.mul_(w_flat.index_select(0, sel)))
        y = slots.view(n, k, self.hidden)
        acc = y[:, 0].clone()
        for r in range(1, k):   # rank order, as llama.cpp adds the views
            acc += y[:, r]
        return acc


def reference_moe(x: torch.Tensor, router: torch.Tensor, gate: ExpertWeight, up: ExpertWeight, down: ExpertWeight,
                  top_k: int, norm_topk: bool, gating: str = "softmax", act: str = "silu",
                  router_bias: torch.Tensor | None = None, selection_bias: torch.Tensor | None = None,
                  weights_scale: float | None = None) -> torch.Tensor:
    """The statement of the math, one token at a time (slow; the tests' reference). An expert product is
    `w @ v` for dense experts and qmatmul of the one row for blocks (the kernel, which tests/test_kernels.py
    checks against the dequantized weights); ties go to the lower expert index."""
    f_act = ACTS[act]

    def mv(w: Weight, v: torch.Tensor) -> torch.Tensor:
        return qmatmul(v.unsqueeze(0).contiguous(), w)[0] if isinstance(w, BlockWeight) else w @ v

    out = []
    for v in x.float():
        logits = router.float() @ v + (0 if router_bias is None else router_bias)
        probs = {"softmax": torch.softmax(logits, -1), "sigmoid": torch.sigmoid(logits), "softmax_weight": logits}[gating]
        select = (probs if selection_bias is None else probs + selection_bias).tolist()
        chosen = sorted(range(len(select)), key=lambda e: (-select[e], e))[:top_k]
        w = probs[chosen]
        if gating == "softmax_weight":
            w = torch.softmax(w, -1)
        if norm_topk:
            w = w / max(float(w.sum()), WEIGHTS_SUM_MIN)
        if weights_scale is not None:
            w = w * weights_scale
        y = torch.zeros(x.shape[1])
        for wk, e in zip(w.tolist(), chosen, strict=True):
            y = y + wk * mv(down.expert(e), f_act(mv(gate.expert(e), v)) * mv(up.expert(e), v))
        out.append(y)
    return torch.stack(out)
