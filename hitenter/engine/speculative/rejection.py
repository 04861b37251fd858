"""The acceptance rules of speculative decoding (Leviathan et al., ICML 2023; Chen et al. 2023).

Sampling rows: drafted token ``x_j ~ q_j`` is accepted with probability ``min(1, p_j(x_j) / q_j(x_j))``;
at the first rejection the emitted token is drawn from ``norm(max(p_j - q_j, 0))`` and the rest are
discarded; when all ``k`` drafts are accepted a bonus token is drawn from ``p_k``. Then every emitted
token has exactly the target's distribution ``p`` (the probabilities after the request's logits
processors). A proposer without probabilities (prompt lookup) is a point mass ``q = onehot(x)``:
``min(1, p(x) / 1) = p(x)`` and ``max(p - onehot(x), 0)`` is ``p`` with ``x`` removed.

Greedy rows: accept while the target's argmax equals the draft; the first mismatch emits the target's
argmax (the token plain decoding would have produced), all accepted emits the bonus argmax.

The engine verifies a sampling row with :func:`race_accept` instead: row ``j``'s token is drawn exactly as
plain decoding draws it (the exponential race with the request's next row seed), and the drafts are kept
while they equal it, so a seeded request emits the very tokens it emits without speculation, and its
generator advances once per emitted token as it does there. A draft model drawing with the same seeds
(its race on its own probabilities: a Gumbel-max coupling) then agrees with the target where the two
distributions are close. ``rejection_sample`` stays the textbook rule (tests/engine/speculative/test_rejection.py).

The functions here (but race_accept) are pure tensor code: the randomness (uniforms ``u``, ``Exp(1)`` draws ``e`` for
the exponential race ``argmax(w / e)`` that samples from unnormalized weights ``w``) is drawn by the
caller from each request's own generator, a fixed amount per step whatever is accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from hitenter.kernels.race import race

_TINY = torch.finfo(torch.float32).tiny


def point_mass(draft: Tensor, vocab_size: int) -> Tensor:
    """One-hot ``q`` [R, K, V] for drafts [R, K] proposed without probabilities (prompt lookup)."""
    return torch.nn.functional.one_hot(draft, vocab_size).to(torch.float32)


def rejection_sample(p: Tensor, q: Tensor, draft: Tensor, u: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """Modified rejection sampling over R independent rows.

    p: target probs [R, K+1, V]; q: draft probs [R, K, V]; draft: drafted ids [R, K] (x_j ~ q_j);
    u: uniforms in [0, 1) [R, K]; e: Exp(1) draws [R, V].
    Returns (num_accepted [R] in 0..K, next_token [R]): the row emits ``draft[:num_accepted]`` then
    ``next_token`` (the resampled token at the first rejection, or the bonus token).
    """
    r, k1, v = p.shape
    k = k1 - 1
    rows = torch.arange(r)
    if k > 0:
        idx = draft.unsqueeze(-1)
        px = p[:, :k].gather(2, idx).squeeze(-1)
        qx = q.gather(2, idx).squeeze(-1)
        accept = u * qx < px                                   # u < p/q, i.e. with probability min(1, p/q)
        num_acc = accept.to(torch.long).cumprod(dim=1).sum(dim=1)
        q_full = torch.cat([q, torch.zeros(r, 1, v, dtype=q.dtype)], dim=1)   # q = 0 at the bonus position
    else:
        num_acc = torch.zeros(r, dtype=torch.long)
        q_full = torch.zeros(r, 1, v, dtype=p.dtype)
    p_at = p[rows, num_acc]
    resid = (p_at - q_full[rows, num_acc]).clamp_min(0.0)
    empty = resid.sum(dim=-1, keepdim=True) <= 0               # p == q up to rounding: fall back to p
    weights = torch.where(empty, p_at, resid)
    token = (weights / e.clamp_min(_TINY)).argmax(dim=-1)
    return num_acc, token


def greedy_accept(target_argmax: Sequence[int], draft: Sequence[int]) -> list[int]:
    """Tokens emitted by a greedy row: the drafts up to the first mismatch, then the target's token."""
    out: list[int] = []
    for j, x in enumerate(draft):
        out.append(target_argmax[j])
        if target_argmax[j] != x:
            return out
    out.append(target_argmax[len(draft)])
    return out


def race_accept(x: Tensor, draft: Sequence[int], seed: Callable[[], int]) -> list[int]:
    """Tokens emitted by a sampling row whose processed logits are ``x`` ``[len(draft) + 1, V]``: row j's
    token is the race over ``x[j]`` with the seed ``seed()`` returns (the request's next row seed, drawn
    only for the rows reached); the drafts up to the first that differs from it, then that token."""
    out: list[int] = []
    for j in range(len(draft) + 1):
        tok = int(race(x[j:j + 1], [seed()])[0])
        out.append(tok)
        if j == len(draft) or tok != draft[j]:
            break
    return out


def draw_randomness(generators: Sequence[torch.Generator | None], k: int, v: int) -> tuple[Tensor, Tensor]:
    """Per row: ``k`` uniforms then ``v`` Exp(1) draws from the row's generator (global RNG when None)."""
    u = torch.empty(len(generators), k, dtype=torch.float32)
    e = torch.empty(len(generators), v, dtype=torch.float32)
    for i, g in enumerate(generators):
        if k:
            u[i].uniform_(generator=g)
        e[i].exponential_(generator=g)
    return u, e
