"""Proposers: who guesses the next k tokens of a request.

- :class:`NgramProposer` (prompt lookup): find the most recent earlier occurrence of the last n tokens
  (n from ``max_n`` down to ``min_n``) in prompt + output and propose what followed it. No model, no
  probabilities (the verifier treats its drafts as point masses).
- :class:`DraftModelProposer`: a smaller model with the target's tokenizer runs k autoregressive steps
  over its own paged KV cache (its own KVCacheManager and ModelRunner). For each request it keeps a
  mirror Request holding the verified tokens + its drafts; after verification the mirror keeps the
  KV of the tokens both agree on (``num_computed_tokens`` rolled back, tail blocks released) and
  catches up on the rest (a whole prompt the first time) in its first step. Drafts are drawn from the
  draft's probabilities after the request's own logits-processor chain (greedy rows: argmax), and
  those probabilities ``q`` are returned for the rejection sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from torch import Tensor

from hitenter.engine.logits_processors import BatchState, LogitsProcessor
from hitenter.engine.model_runner import ModelRunner
from hitenter.engine.request import Request, RequestStatus
from hitenter.engine.sampler import run_chain
from hitenter.engine.scheduler import ScheduledRequest, SchedulerOutput
from hitenter.kv_cache.manager import KVCacheManager

_TINY = torch.finfo(torch.float32).tiny


@dataclass
class Draft:
    token_ids: list[int]
    probs: Tensor | None      # [len(token_ids), V] draft probabilities, None = point masses / greedy


class Proposer(Protocol):
    def propose(self, reqs: Sequence[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
                generators: Sequence[torch.Generator | None]) -> list[Draft]: ...

    def release(self, request_id: str) -> None: ...

    @property
    def request_ids(self) -> list[str]:
        """Requests the proposer holds state for."""
        ...


def stop_ids(req: Request) -> frozenset[int]:
    return req.eos_token_ids | frozenset(req.sampling_params.stop_token_ids or ())


class NgramProposer:
    """Prompt lookup decoding: continue the latest earlier match of the last ``n`` tokens."""

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        arr = np.asarray(tokens, dtype=np.int64)
        size = len(arr)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            windows = sliding_window_view(arr[:size - 1], n)       # starts 0..size-1-n: each has a follower
            hits = np.flatnonzero((windows == arr[size - n:]).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return arr[start:start + k].tolist()
        return []

    def propose(self, reqs: Sequence[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
                generators: Sequence[torch.Generator | None]) -> list[Draft]:
        return [Draft(self.lookup(r.all_token_ids, k), None) for r, k in zip(reqs, ks, strict=True)]

    def release(self, request_id: str) -> None:
        pass

    @property
    def request_ids(self) -> list[str]:
        return []


class DraftModelProposer:
    """A draft model on its own paged KV cache, kept in step with the target's verified tokens."""

    def __init__(self, runner: ModelRunner, kv: KVCacheManager) -> None:
        self.runner = runner
        self.kv = kv
        self._mirrors: dict[str, Request] = {}
        self._verified: dict[str, int] = {}     # output tokens known equal to the target's, per mirror

    def release(self, request_id: str) -> None:
        m = self._mirrors.pop(request_id, None)
        self._verified.pop(request_id, None)
        if m is not None:
            self.kv.free(m)

    @property
    def request_ids(self) -> list[str]:
        return list(self._mirrors)

    def _sync(self, req: Request) -> Request:
        """The mirror of ``req`` holding its verified tokens, KV kept for the prefix both agree on."""
        rid = req.request_id
        m = self._mirrors.get(rid)
        if m is None:
            m = Request(rid, list(req.prompt_token_ids), req.sampling_params, req.max_tokens,
                        req.eos_token_ids, status=RequestStatus.RUNNING)
            self._mirrors[rid] = m
            self._verified[rid] = 0
        outs, mo = req.output_token_ids, m.output_token_ids
        c, lim = self._verified[rid], min(len(outs), len(mo))
        while c < lim and outs[c] == mo[c]:
            c += 1
        del mo[c:]
        mo.extend(outs[c:])
        self._verified[rid] = len(outs)
        m.num_computed_tokens = min(m.num_computed_tokens, m.num_prompt_tokens + c, m.num_tokens - 1)
        self.kv.trim(m, m.num_computed_tokens)
        return m

    @torch.inference_mode()
    def propose(self, reqs: Sequence[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
                generators: Sequence[torch.Generator | None]) -> list[Draft]:
        mirrors = [self._sync(r) for r in reqs]
        grammars = [r.extra.get("grammar") for r in reqs]   # structured outputs: the draft obeys them too
        pushed = [0] * len(reqs)
        try:
            return self._draft(mirrors, ks, chain, generators, grammars, pushed)
        finally:
            for g, n in zip(grammars, pushed, strict=True):
                if g is not None:
                    g.pop(n)        # the target's matchers back where verification expects them

    def _draft(self, mirrors: list[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
               generators: Sequence[torch.Generator | None], grammars: list[Any], pushed: list[int]) -> list[Draft]:
        """k autoregressive draft steps; a constrained request's draws are masked by its grammar, which
        is advanced over the drafted tokens (``pushed`` counts them, for the caller to roll back)."""
        limit = list(ks)
        toks: list[list[int]] = [[] for _ in mirrors]
        probs: list[list[Tensor]] = [[] for _ in mirrors]
        for _ in range(max(ks, default=0)):
            scheduled, rows = [], []
            for i, m in enumerate(mirrors):
                if len(toks[i]) >= limit[i]:
                    continue
                n = m.num_tokens - m.num_computed_tokens
                if self.kv.allocate_slots(m, n) is None:    # the draft cache is full: stop drafting this one
                    limit[i] = len(toks[i])
                    continue
                scheduled.append(ScheduledRequest(m, n, m.num_computed_tokens, self.kv.block_table(m.request_id)))
                rows.append(i)
            if not scheduled:
                break
            out = self.runner.execute(SchedulerOutput(0, scheduled, [], sum(s.num_new_tokens for s in scheduled)))
            assert out.logits is not None and len(out.sample_request_ids) == len(rows)
            for sr in scheduled:
                sr.request.num_computed_tokens += sr.num_new_tokens
            sel = [mirrors[i] for i in rows]
            cons = [grammars[i] for i in rows]
            batch = BatchState([m.sampling_params for m in sel], [m.prompt_token_ids for m in sel],
                               [m.output_token_ids for m in sel], [stop_ids(m) for m in sel],
                               cons if any(c is not None for c in cons) else ())
            x, _ = run_chain(chain, out.logits, batch)
            for j, i in enumerate(rows):
                if mirrors[i].sampling_params.is_greedy:
                    tok = int(x[j].argmax())
                else:
                    p = torch.softmax(x[j], dim=-1)
                    e = torch.empty_like(p).exponential_(generator=generators[i]).clamp_min_(_TINY)
                    tok = int((p / e).argmax())
                    probs[i].append(p)
                toks[i].append(tok)
                mirrors[i].output_token_ids.append(tok)
                if grammars[i] is not None and grammars[i].push(tok):
                    pushed[i] += 1
        return [Draft(t, torch.stack(p) if p else None) for t, p in zip(toks, probs, strict=True)]
