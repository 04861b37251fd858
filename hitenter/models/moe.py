"""Mixture-of-experts feed-forward (Mixtral, Qwen2/3-MoE, OLMoE, gpt-oss, ...) on the GGUF's own expert blocks.

Weights: models/experts.py (re-exported here): `expert_weights(reader, name)` reads a 3-D expert tensor as
an `ExpertWeight` (the file's blocks, or dense fp32), `dense_experts(t)` wraps an fp32 [E, out, in]
tensor. MoEFFN holds one module per expert and projection (gate+up, down), so the loader's
`own_block_bytes(model)` owns their bytes like every other BlockLinear's; nothing else to call.

Routing (llama.cpp's build_moe_ffn order): logits = x router^T (+ router_bias, ffn_gate_inp.bias);
probs = softmax over all experts ("softmax"), sigmoid ("sigmoid") or the logits ("softmax_weight");
top-k of probs (+ selection_bias, DeepSeek's exp_probs_b, for the choice only), ties to the lower
expert index; weights = the chosen probs (softmax over the k for "softmax_weight"), divided by their
sum when norm_topk (summed in order, clamped at 2^-14 as llama.cpp does), times weights_scale if given.
y = sum over ranks k = 0..K-1, in that order, of w_k * (down_e(glu(gate_e x + bg, up_e x + bu)) + bd),
glu one of silu (SwiGLU), gelu (tanh GeGLU), relu, swiglu_oai (gpt-oss: alpha 1.702, limit 7); the
expert biases (gpt-oss) are optional. Ungated experts (no gate projection, Nemotron-H's): down_e(act(up_e x))
with act relu2 (relu(u)^2). `weights_on_input` (Llama 4, llama.cpp's weight_before_ffn): the top-k chosen on
the logits, and each chosen expert's input multiplied by its weight instead of its output. `expert_scale`
(Gemma 4's per-expert down scale, [E]): each chosen weight times its expert's scale. `forward(x, n_real,
router_x)`: the router reads router_x where given (Gemma 4 routes on its own norm of the input).

Grouped execution: the rows routed to each active expert are gathered and run through one qmatmul per
projection (gate+up one call once owned, down one); each (row, rank) result is scaled by its weight and
copied to its own slot, then a row's K slots are added in rank order. A single row (a decode step)
takes the same operations without the gather. Batch invariance: the block kernels give a row the same
bits for any M; dense GEMMs (the router, dense experts, blocks on the torch reference path) run on row
counts padded to a multiple of 8 (as layers.py's pad_rows); every other op is elementwise or per row,
so a row's output bits depend neither on the other rows nor on the path (T = 1 or grouped).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.kernels import BlockWeight, qmatmul
from hitenter.models.experts import (
    ExpertLinear,
    ExpertWeight,
    Weight,
    adjacent_rows,
    dense_experts,
    expert_linear,
    expert_weights,
)
from hitenter.models.layers import pad_rows
from hitenter.models.linear import Linear

__all__ = ["ExpertLinear", "ExpertWeight", "MoEFFN", "adjacent_rows", "dense_experts", "expert_linear",
           "expert_weights", "reference_moe"]

WEIGHTS_SUM_MIN = 6.103515625e-5   # llama.cpp clamps the top-k weights' sum here (smallest normal fp16)
GATINGS = ("softmax", "sigmoid", "softmax_weight")
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0  # llama.cpp's swiglu_oai constants (gpt-oss)


def _swiglu_oai(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """ggml_swiglu_oai: x = min(g, limit); x / (1 + exp(-alpha x)) * (clamp(u, -limit, limit) + 1)."""
    x = g.clamp(max=OAI_LIMIT)
    return (x / (x * -OAI_ALPHA).exp_().add_(1.0)).mul_(u.clamp(-OAI_LIMIT, OAI_LIMIT).add_(1.0))


GLUS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "silu": lambda g, u: F.silu(g).mul_(u),
    "gelu": lambda g, u: F.gelu(g, approximate="tanh").mul_(u),
    "relu": lambda g, u: F.relu(g).mul_(u),
    "swiglu_oai": _swiglu_oai,
}
UNGATED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu2": lambda u: F.relu(u).square(),
                                                              "gelu": lambda u: F.gelu(u, approximate="tanh")}
Biases = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def _needs_padding(m: nn.Module) -> bool:
    return isinstance(m, Linear) or bool(getattr(m, "needs_row_padding", False))


def _check(gate: ExpertWeight | None, up: ExpertWeight, down: ExpertWeight, router: torch.Tensor, top_k: int,
           gating: str, act: str) -> None:
    e, h = router.shape
    acts = GLUS if gate is not None else UNGATED
    if gating not in GATINGS or act not in acts:
        raise ValueError(f"MoEFFN: gating {gating!r} / act {act!r}; known {GATINGS} / {sorted(acts)}")
    if gate is None:
        gate = up
    if {gate.n_expert, up.n_expert, down.n_expert} != {e} or not 0 < top_k <= e:
        raise ValueError(f"MoEFFN: router has {e} experts, projections {gate.n_expert}/{up.n_expert}/"
                         f"{down.n_expert}, top_k {top_k}")
    f = gate.out_features
    if (gate.in_features, up.in_features, up.out_features, down.in_features, down.out_features) != (h, h, f, f, h):
        raise ValueError(f"MoEFFN: shapes gate {gate.out_features}x{gate.in_features}, up {up.out_features}x"
                         f"{up.in_features}, down {down.out_features}x{down.in_features} do not fit hidden {h}")


def _frozen(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t.float().contiguous(), requires_grad=False)


class MoEFFN(nn.Module):
    """y [T, H] = the mixture of the top-k experts for each row of x [T, H] (fp32 in and out); see the
    module doc. `forward(x, n_real)`: only the first n_real rows (default all) are routed; rows past it
    (a model's padding) come back zero. expert_bias: (gate [E, F], up [E, F], down [E, H]), any None."""

    def __init__(self, router: torch.Tensor, gate: ExpertWeight | None, up: ExpertWeight, down: ExpertWeight,
                 top_k: int, norm_topk: bool, gating: str = "softmax", act: str = "silu",
                 router_bias: torch.Tensor | None = None, selection_bias: torch.Tensor | None = None,
                 weights_scale: float | None = None, expert_bias: Biases | None = None,
                 weights_on_input: bool = False, expert_scale: torch.Tensor | None = None) -> None:
        super().__init__()
        _check(gate, up, down, router, top_k, gating, act)
        self.n_expert, self.hidden = router.shape
        self.ffn = up.out_features
        self.top_k, self.norm_topk, self.gating = top_k, norm_topk, gating
        self.glu = GLUS[act] if gate is not None else None
        self.act = None if gate is not None else UNGATED[act]
        self.weights_scale = weights_scale
        self.weights_on_input = weights_on_input
        self.expert_scale = _frozen(expert_scale)
        # stored [H, E]: x @ router_t (an NN GEMM) is faster than F.linear at few rows, row invariant alike
        self.router_t = nn.Parameter(router.float().t().contiguous(), requires_grad=False)
        self.router_bias, self.selection_bias = _frozen(router_bias), _frozen(selection_bias)
        bg, bu, bd = expert_bias or (None, None, None)
        if gate is None and (bg is not None or bu is not None):
            raise ValueError("MoEFFN: gate / up expert biases need gated experts")
        zeros = torch.zeros(self.n_expert, self.ffn)
        self.gate_up_bias = None if bg is None and bu is None else _frozen(
            torch.cat([zeros if bg is None else bg, zeros if bu is None else bu], dim=1))
        self.down_bias = _frozen(bd)
        self.gate_up = nn.ModuleList(expert_linear([gate.expert(e), up.expert(e)] if gate is not None else [up.expert(e)])
                                     for e in range(self.n_expert))
        self.down = nn.ModuleList(expert_linear([down.expert(e)]) for e in range(self.n_expert))
        self._gate_up, self._down = list(self.gate_up), list(self.down)   # plain lists: no ModuleList lookups

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [T, K] by rank, fp32 weights [T, K]) for x [T, H]; per row, batch invariant."""
        n = x.shape[0]
        # the GEMM and the gating on the padded rows, then the real ones: a dense GEMM needs its row count
        # padded, and an elementwise exp / sigmoid takes a scalar path on the elements past the tensor's last
        # whole vector group, so its bits would depend on n
        logits = pad_rows(x) @ self.router_t
        if self.router_bias is not None:
            logits = logits + self.router_bias
        probs = {"softmax": lambda: torch.softmax(logits, dim=-1), "sigmoid": lambda: torch.sigmoid(logits),
                 "softmax_weight": lambda: logits}[self.gating]()[:n]
        select = probs if self.selection_bias is None else probs + self.selection_bias
        if self.weights_on_input:   # Llama 4: chosen on the logits (sigmoid's saturated ties kept apart)
            select = logits[:n]
        # a stable descending sort: equal scores keep index order, so a tie goes to the lower expert
        idx = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :self.top_k]
        w = probs.gather(1, idx)
        if self.gating == "softmax_weight":
            w = torch.softmax(w, dim=-1)
        if self.norm_topk:   # cumsum: each row summed in order (in double on CPU), whatever T
            w = w / w.cumsum(dim=-1)[:, -1:].clamp(min=WEIGHTS_SUM_MIN)
        if self.weights_scale is not None:
            w = w * self.weights_scale
        if self.expert_scale is not None:
            w = w * self.expert_scale[idx]
        return idx, w

    def expert_ffn(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x [n, H] -> [n, H] (fresh): down(glu(gate x, up x)), biases where given. Owned
        blocks on the native kernel: two qmatmuls, no module calls; else the modules, padded where a
        GEMM needs it (the same bits per row either way)."""
        n, f = x.shape[0], self.ffn
        gu, dn = self._gate_up[e], self._down[e]
        wg, wd = getattr(gu, "one", None), getattr(dn, "one", None)
        fast = wg is not None and wd is not None and not gu.needs_row_padding
        h = qmatmul(x, wg) if fast else gu(pad_rows(x) if _needs_padding(gu) else x)
        if self.gate_up_bias is not None:
            h.add_(self.gate_up_bias[e])
        a = self.glu(h[:, :f], h[:, f:]) if self.glu is not None else self.act(h)   # type: ignore[misc]
        o = qmatmul(a, wd) if fast else dn(pad_rows(a) if _needs_padding(dn) else a)[:n]
        return o if self.down_bias is None else o.add_(self.down_bias[e])

    def forward(self, x: torch.Tensor, n_real: int | None = None, router_x: torch.Tensor | None = None) -> torch.Tensor:
        t = x.shape[0]
        n = t if n_real is None else n_real
        x = x.float()
        if n == 0:
            return x.new_zeros(t, self.hidden)
        idx, w = self.route((x if router_x is None else router_x.float())[:n])
        acc = self._decode_row(x[:1], idx, w) if n == 1 else self._grouped(x[:n], idx, w)
        if n == t:
            return acc
        out = x.new_zeros(t, self.hidden)
        out[:n] = acc
        return out

    def _decode_row(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """One row: its experts in rank order, each output times its weight, added as they come (the
        same operations per row as `_grouped`, so the same bits)."""
        acc = None
        for e, wk in zip(idx[0].tolist(), w[0].tolist(), strict=True):
            if self.weights_on_input:
                o = self.expert_ffn(e, x * wk)
            else:
                o = self.expert_ffn(e, x).mul_(wk)   # wk: the fp32 weight as a Python float, the same product
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
            xe, we = x.index_select(0, sel // k), w_flat.index_select(0, sel)
            if self.weights_on_input:
                slots.index_copy_(0, sel, self.expert_ffn(e, xe * we))
            else:
                slots.index_copy_(0, sel, self.expert_ffn(e, xe).mul_(we))
        y = slots.view(n, k, self.hidden)
        acc = y[:, 0].clone()
        for r in range(1, k):   # rank order, as llama.cpp adds the views
            acc += y[:, r]
        return acc


def reference_moe(x: torch.Tensor, router: torch.Tensor, gate: ExpertWeight | None, up: ExpertWeight,
                  down: ExpertWeight,
                  top_k: int, norm_topk: bool, gating: str = "softmax", act: str = "silu",
                  router_bias: torch.Tensor | None = None, selection_bias: torch.Tensor | None = None,
                  weights_scale: float | None = None, expert_bias: Biases | None = None) -> torch.Tensor:
    """The statement of the math, one token at a time (slow; the tests' reference). An expert product is
    `w @ v` for dense experts and qmatmul of the one row for blocks (the kernel, which tests/kernels/test_qmatmul.py
    checks against the dequantized weights); ties go to the lower expert index."""
    glu = GLUS[act] if gate is not None else None
    bg, bu, bd = expert_bias or (None, None, None)

    def mv(w: Weight, v: torch.Tensor, b: torch.Tensor | None, e: int) -> torch.Tensor:
        y = qmatmul(v.unsqueeze(0).contiguous(), w)[0] if isinstance(w, BlockWeight) else w @ v
        return y if b is None else y + b[e]

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
            u = mv(up.expert(e), v, bu, e)
            h = glu(mv(gate.expert(e), v, bg, e), u) if glu is not None and gate is not None else UNGATED[act](u)
            y = y + wk * mv(down.expert(e), h, bd, e)
        out.append(y)
    return torch.stack(out)
