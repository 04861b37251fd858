"""The logits processors of the sampler chain, each vectorized over a batch with per-row params.

Contract for every processor (``LogitsProcessor``):
- ``proc(logits, batch)`` takes fp32 logits ``[N, V]`` and returns processed logits (it may work in
  place). A cut token is ``-inf``; a processor never turns ``-inf`` back into a finite value.
- Rows the processor does not apply to are left bitwise untouched, and the rows it does apply to are
  processed independently of each other, so a row's result never depends on what else is in the batch.
- Sampling-only stages (temperature, top-k, top-p, min-p) skip greedy rows: a greedy row's argmax is
  taken right after penalties, logit bias and min_tokens suppression.

Default order (``default_chain()``), as in vLLM/llama.cpp:
penalties -> logit_bias -> min_tokens -> grammar -> temperature -> top_k -> top_p -> min_p
(``grammar`` is structured outputs' token mask, hitenter/engine/structured.py).

Ties are broken deterministically towards the lower token id (stable sort on the logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from hitenter.sampling_params import SamplingParams

NEG_INF = float("-inf")


@dataclass
class BatchState:
    """Per-row inputs the processors read (one entry per logits row)."""

    params: Sequence[SamplingParams]
    prompt_token_ids: Sequence[Sequence[int]]
    output_token_ids: Sequence[Sequence[int]]
    stop_token_ids: Sequence[frozenset[int]]
    constraints: Sequence[Any] = ()     # per row a structured.GrammarConstraint or None (empty: none)

    def rows(self, *, sampling_only: bool, pred) -> list[int]:  # type: ignore[no-untyped-def]
        """Row indices where ``pred(i, params)`` holds (greedy rows excluded when ``sampling_only``)."""
        return [i for i, p in enumerate(self.params)
                if not (sampling_only and p.is_greedy) and pred(i, p)]


class LogitsProcessor(Protocol):
    name: str

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor: ...


def _ids_tensor(rows: list[int], lists: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """(local row index, token id) pairs for ``lists[rows[j]]``, flattened."""
    lengths = [len(lists[r]) for r in rows]
    flat = [t for r in rows for t in lists[r]]
    row_idx = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(lengths, dtype=torch.long))
    return row_idx, torch.tensor(flat, dtype=torch.long)


class Penalties:
    """vLLM repetition penalty (prompt + output tokens: positive logits / r, negative * r), then OpenAI
    frequency (``- f * count``) and presence (``- p * [count > 0]``) over output tokens only.
    Works on the seen (row, token) pairs only, so its cost grows with the token counts, not N * V."""

    name = "penalties"

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor:
        rows = batch.rows(sampling_only=False, pred=lambda i, p: p.has_penalties)
        if not rows:
            return logits
        sub = logits[rows].contiguous()
        v = sub.shape[1]
        flat = sub.view(-1)
        ps = [batch.params[r] for r in rows]
        o_row, o_ids = _ids_tensor(rows, batch.output_token_ids)
        out_keys, out_counts = torch.unique(o_row * v + o_ids, return_counts=True)
        rep = torch.tensor([p.repetition_penalty for p in ps], dtype=torch.float32)
        if bool((rep != 1.0).any()):
            p_row, p_ids = _ids_tensor(rows, batch.prompt_token_ids)
            seen = torch.unique(torch.cat([p_row * v + p_ids, out_keys]))
            r = rep[seen // v]
            seen = seen[r != 1.0]
            r = r[r != 1.0]
            x = flat[seen]
            flat[seen] = torch.where(x > 0, x / r, x * r)
        freq = torch.tensor([p.frequency_penalty for p in ps], dtype=torch.float32)
        pres = torch.tensor([p.presence_penalty for p in ps], dtype=torch.float32)
        if len(out_keys):
            row_of = out_keys // v
            flat[out_keys] = (flat[out_keys] - freq[row_of] * out_counts.to(torch.float32)) - pres[row_of]
        logits[rows] = sub
        return logits


class LogitBias:
    """Adds ``params.logit_bias[token]`` to the token's logit (OpenAI semantics, before temperature)."""

    name = "logit_bias"

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor:
        rows = batch.rows(sampling_only=False, pred=lambda i, p: bool(p.logit_bias))
        if not rows:
            return logits
        r_idx, ids, vals = [], [], []
        for r in rows:
            for tid, b in batch.params[r].logit_bias.items():  # type: ignore[union-attr]
                r_idx.append(r)
                ids.append(tid)
                vals.append(b)
        logits.index_put_((torch.tensor(r_idx), torch.tensor(ids)),
                          torch.tensor(vals, dtype=torch.float32), accumulate=True)
        return logits


class MinTokens:
    """While a row has fewer than ``min_tokens`` output tokens, its stop ids (eos/eog +
    stop_token_ids, from ``batch.stop_token_ids``) get ``-inf``."""

    name = "min_tokens"

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor:
        rows = batch.rows(sampling_only=False, pred=lambda i, p: (
            len(batch.output_token_ids[i]) < p.min_tokens and bool(batch.stop_token_ids[i])))
        if not rows:
            return logits
        v = logits.shape[1]
        pairs = [(r, t) for r in rows for t in batch.stop_token_ids[r] if 0 <= t < v]
        if pairs:
            logits[torch.tensor([r for r, _ in pairs]), torch.tensor([t for _, t in pairs])] = NEG_INF
        return logits


class Temperature:
    """Divides the logits by the row's temperature in fp32 (greedy rows untouched), in place: one
    division of the whole batch by a per-row divisor, 1.0 for the rows left alone (x / 1 is x, bit
    for bit), instead of a gather and a scatter of the rows."""

    name = "temperature"

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor:
        rows = batch.rows(sampling_only=True, pred=lambda i, p: p.temperature != 1.0)
        if rows:
            t = [1.0] * logits.shape[0]
            for r in rows:
                t[r] = batch.params[r].temperature
            logits.div_(torch.tensor(t, dtype=torch.float32)[:, None])
        return logits


def _sorted_desc(sub: Tensor) -> tuple[Tensor, Tensor]:
    """Stable descending sort: equal logits keep token-id order, so ties favour the lower id."""
    return torch.sort(sub, dim=-1, descending=True, stable=True)


class TopK:
    """Keeps exactly the ``top_k`` highest logits per row (ties -> lower ids); -1/0 = off."""

    name = "top_k"

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor:
        v = logits.shape[1]
        rows = batch.rows(sampling_only=True, pred=lambda i, p: 0 < p.top_k < v)
        if rows:
            sub = logits[rows]
            k = torch.tensor([batch.params[r].top_k for r in rows])[:, None]
            kth = torch.topk(sub, int(k.max()), dim=-1).values.gather(1, k - 1)   # the k-th largest logit
            above = sub > kth
            tied = sub == kth
            room = k - above.sum(dim=-1, keepdim=True)             # tied slots left, filled by lower ids
            keep = above | (tied & (torch.cumsum(tied, dim=-1) <= room))
            logits[rows] = sub.masked_fill(~keep, NEG_INF)
        return logits


def _candidates_desc(sub: Tensor) -> tuple[Tensor, Tensor]:
    """Finite logits of each row sorted descending, ties by lower id: (values, ids) ``[n, m]`` where m
    is the largest finite count over the rows (-inf padding). Sorts only m entries when m is small."""
    m = int(torch.isfinite(sub).sum(dim=-1).max())
    if m * 4 >= sub.shape[1]:
        return _sorted_desc(sub)
    vals, ids = torch.topk(sub, max(m, 1), dim=-1)
    ids, order = torch.sort(ids, dim=-1)                           # id order first ...
    vals = vals.gather(1, order)
    vals, order = torch.sort(vals, dim=-1, descending=True, stable=True)   # ... kept among equal values
    return vals, ids.gather(1, order)


class TopP:
    """Keeps the smallest prefix of the descending-sorted distribution whose probability mass is
    ``>= top_p`` (always at least the most likely token); softmax in fp32; ``top_p == 1`` = off."""

    name = "top_p"

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor:
        rows = batch.rows(sampling_only=True, pred=lambda i, p: p.top_p < 1.0)
        if rows:
            sub = logits[rows]
            vals, idx = _candidates_desc(sub)
            sp = torch.softmax(sub, dim=-1).gather(1, idx)
            cs = torch.cumsum(sp, dim=-1)
            mass_before = torch.cat([torch.zeros_like(cs[:, :1]), cs[:, :-1]], dim=1)  # exclusive prefix sum
            top_p = torch.tensor([batch.params[r].top_p for r in rows], dtype=torch.float32)[:, None]
            keep_sorted = (mass_before < top_p) & torch.isfinite(vals)
            keep_sorted[:, 0] = True
            keep = torch.zeros_like(sub, dtype=torch.bool).scatter_(1, idx, keep_sorted)
            logits[rows] = sub.masked_fill(~keep, NEG_INF)
        return logits


class MinP:
    """Keeps tokens with ``p >= min_p * p_max`` (p from the distribution after the previous stages;
    the rule is scale-free, so renormalizing first would not change it); ``min_p == 0`` = off."""

    name = "min_p"

    def __call__(self, logits: Tensor, batch: BatchState) -> Tensor:
        rows = batch.rows(sampling_only=True, pred=lambda i, p: p.min_p > 0.0)
        if rows:
            sub = logits[rows]
            probs = torch.softmax(sub, dim=-1)
            min_p = torch.tensor([batch.params[r].min_p for r in rows], dtype=torch.float32)[:, None]
            cut = probs < min_p * probs.max(dim=-1, keepdim=True).values
            logits[rows] = sub.masked_fill(cut, NEG_INF)
        return logits


def default_chain() -> list[LogitsProcessor]:
    """penalties -> logit_bias -> min_tokens -> grammar -> temperature -> top_k -> top_p -> min_p."""
    from hitenter.engine.structured import GrammarMask  # structured outputs' token mask

    return [Penalties(), LogitBias(), MinTokens(), GrammarMask(), Temperature(), TopK(), TopP(), MinP()]
