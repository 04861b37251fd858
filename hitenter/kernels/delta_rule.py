"""The gated delta rule over one sequence's span of tokens: the recurrence of Gated DeltaNet layers
(models/recurrent/gated_deltanet.py), as llama.cpp's ``ggml_gated_delta_net`` computes it.

Per value head h, with the state ``S [dk, dv]`` (fp32), for each token t in order:

    S    = S * exp(g[t, h])                       # the decay (g <= 0)
    d    = (v[t, h] - k[t, h] @ S) * beta[t, h]   # the delta: what the state mispredicts for k, [dv]
    S    = S + outer(k[t, h], d)
    o[t, h] = (q[t, h] @ S) * scale

``q``, ``k`` are the value head's key head (already repeated to value heads by the caller).

:func:`delta_rule_reference` states it in torch (all heads at once, token by token: the op shapes
depend only on the head count and sizes, never on the span or the batch). :func:`delta_rule` runs the
native kernel (``csrc/recurrent/delta_rule.c``: per head, the state kept in cache while the span's tokens go
through it; AVX-512, AVX2 or portable vector code) where it is built, else the reference (one warning
when it cannot be built). Both update ``state`` in place and return ``o [T, H, dv]``; the two agree to
float rounding (tested), and each alone gives a row the same bits however its sequence's tokens were
cut into spans. :func:`delta_rule_rows` takes one token of each of N sequences (generation rows) in one
call, each row the bits of its one-token span on the same path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hitenter.kernels.native import DELTA_RULE

__all__ = ["delta_rule", "delta_rule_reference", "delta_rule_rows"]

load = DELTA_RULE


def _check(state: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> None:
    h, dk, dv = state.shape
    t = q.shape[0]
    if q.shape != (t, h, dk) or k.shape != (t, h, dk) or v.shape != (t, h, dv):
        raise ValueError(f"delta rule: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit "
                         f"the state [{h}, {dk}, {dv}]")
    if g.shape != (t, h) or beta.shape != (t, h):
        raise ValueError(f"delta rule: g {tuple(g.shape)} and beta {tuple(beta.shape)} must be [{t}, {h}]")
    if any(x.dtype != torch.float32 for x in (state, q, k, v, g, beta)):
        raise ValueError("delta rule: every tensor must be float32")


def delta_rule_reference(state: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                         scale: float) -> Tensor:
    """``o [T, H, dv]`` of the span (see the module docstring); ``state [H, dk, dv]`` updated in place.
    q, k ``[T, H, dk]``, v ``[T, H, dv]``, g and beta ``[T, H]``, all float32."""
    _check(state, q, k, v, g, beta)
    out = torch.empty(v.shape, dtype=torch.float32)
    s = state.clone()
    for t in range(q.shape[0]):
        s.mul_(torch.exp(g[t])[:, None, None])   # per token: its bits never depend on the span's length
        sk = (k[t][:, :, None] * s).sum(1)                       # [H, dv]
        d = (v[t] - sk) * beta[t][:, None]
        s.add_(k[t][:, :, None] * d[:, None, :])
        out[t] = (q[t][:, :, None] * s).sum(1) * scale
    state.copy_(s)
    return out


def delta_rule(state: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float,
               num_threads: int | None = None) -> Tensor:
    """:func:`delta_rule_reference`'s contract, on the native kernel where it is built (heads split over
    ``num_threads``, default torch's; each head's arithmetic is the same on any thread)."""
    _check(state, q, k, v, g, beta)
    lib = load()
    if lib is None or not state.is_contiguous():
        return delta_rule_reference(state, q, k, v, g, beta, scale)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    t, h, dk = q.shape
    dv = v.shape[2]
    out = torch.empty(v.shape, dtype=torch.float32)
    rc = lib.delta_rule(state.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(),
                        beta.data_ptr(), out.data_ptr(), t, h, dk, dv, scale, num_threads or torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"delta_rule kernel failed ({rc})")
    return out


def delta_rule_rows(states: Tensor, slots: list[int], q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                    scale: float, num_threads: int | None = None) -> Tensor:
    """One token of each of N sequences: row r's state is ``states[slots[r]]`` (``states [S, H, dk, dv]``,
    float32, updated in place; the slots distinct); q, k ``[N, H, dk]``, v ``[N, H, dv]``, g, beta ``[N, H]``.
    Returns ``o [N, H, dv]``, row r bit-equal to :func:`delta_rule` (or, without the kernel,
    :func:`delta_rule_reference`) on that row alone."""
    n = q.shape[0]
    if len(slots) != n or len(set(slots)) != n:
        raise ValueError(f"delta rule rows: {len(slots)} slots (distinct: {len(set(slots))}) for {n} rows")
    lib = load()
    if n == 0:
        return torch.empty(v.shape, dtype=torch.float32)
    if lib is None or not states.is_contiguous():   # row by row, on the path a one-row span takes
        one = delta_rule_reference if lib is None else delta_rule
        return torch.cat([one(states[s], q[r:r + 1], k[r:r + 1], v[r:r + 1], g[r:r + 1], beta[r:r + 1], scale)
                          for r, s in enumerate(slots)])
    _check(states[0], q, k, v, g, beta)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    idx = torch.tensor(slots, dtype=torch.int64)
    out = torch.empty(v.shape, dtype=torch.float32)
    h, dk, dv = states.shape[1:]
    rc = lib.delta_rule_rows(states.data_ptr(), idx.data_ptr(), h * dk * dv, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                             g.data_ptr(), beta.data_ptr(), out.data_ptr(), n, h, dk, dv, scale,
                             num_threads or torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"delta_rule_rows kernel failed ({rc})")
    return out
