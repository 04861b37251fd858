"""Raw-distribution logprobs of sampled tokens: the chosen token's logprob and rank plus the top-k
alternatives (ties -> lower id), as the Sampler and speculative decoding report them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    rank: int                              # 1 = the most likely token
    top: list[tuple[int, float, int]]      # (token_id, logprob, rank) of the top alternatives, best first


def _top_exact(lp: Tensor, k: int) -> list[tuple[int, float, int]]:
    """Top k of one row, ties -> lower id (exact, for rows whose k-th value is tied)."""
    kth = torch.topk(lp, k).values[-1]
    ids = torch.nonzero(lp >= kth).flatten()
    vals, order = torch.sort(lp[ids], descending=True, stable=True)
    return [(int(t), float(x), r + 1) for r, (t, x) in enumerate(zip(ids[order[:k]], vals[:k], strict=True))]


def batch_logprobs(lps: Tensor, chosen: Tensor, ks: list[int]) -> list[TokenLogprobs]:
    """Chosen logprob, rank (1 + #strictly higher) and top-k alternatives (ties -> lower id) per row."""
    n, v = lps.shape
    chosen_lp = lps.gather(1, chosen[:, None])
    ranks = ((lps > chosen_lp).sum(dim=-1) + 1).tolist()
    kk = min(max(ks) + 1, v)
    vals = ids = None
    if max(ks) > 0:
        vals, ids = torch.topk(lps, kk, dim=-1)
        ids, order = torch.sort(ids, dim=-1)
        vals, order = torch.sort(vals.gather(1, order), dim=-1, descending=True, stable=True)
        ids = ids.gather(1, order)
    out = []
    for j, k in enumerate(ks):
        k = min(k, v)
        top: list[tuple[int, float, int]] = []
        if k > 0 and vals is not None and ids is not None:
            if k < kk and bool(vals[j, k] == vals[j, k - 1]):     # a tie across the cut: do it exactly
                top = _top_exact(lps[j], k)
            else:
                top = [(int(t), float(x), r + 1) for r, (t, x) in
                       enumerate(zip(ids[j, :k].tolist(), vals[j, :k].tolist(), strict=True))]
        out.append(TokenLogprobs(int(chosen[j]), float(chosen_lp[j, 0]), ranks[j], top))
    return out


def token_logprobs(logits: Tensor, tokens: Tensor, ks: list[int]) -> list[TokenLogprobs]:
    """Raw logprobs (``log_softmax`` of ``logits`` [N, V]) of ``tokens`` [N] with each row's rank and top
    ``ks[i]`` alternatives, exactly as the Sampler reports them (for speculative decoding's rows)."""
    return batch_logprobs(torch.log_softmax(logits.to(torch.float32), dim=-1), tokens, ks)
