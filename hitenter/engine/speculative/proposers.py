"""Proposers: who guesses the next k tokens of a request.

- :class:`NgramProposer` (prompt lookup): find the earlier occurrence of the longest suffix (``min_n`` to
  ``max_n`` tokens; the latest of the longest) in prompt + output and propose what followed it. No model.
- :class:`DraftModelProposer`: a smaller model with the target's tokenizer runs k autoregressive steps
  over its own paged KV cache (its own KVCacheManager and ModelRunner). For each request it keeps a
  mirror Request holding the verified tokens + its drafts; after verification the mirror keeps the
  KV of the tokens both agree on (``num_computed_tokens`` rolled back, tail blocks released) and
  catches up on the rest (a whole prompt the first time) in its first step. Drafts are drawn from the
  draft's logits after the request's own logits-processor chain: greedy rows by argmax, sampling rows
  by the sampler's race with the seeds the target's rows will draw (peeked, not consumed), so the
  verifier (which draws each row as plain decoding does) accepts them where the two models agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from hitenter.engine.logits_processors import BatchState, LogitsProcessor
from hitenter.engine.model_runner import ModelRunner
from hitenter.engine.sampler import row_seed, run_chain
from hitenter.engine.scheduler import ScheduledRequest, SchedulerOutput
from hitenter.kernels.race import greedy_argmax, race
from hitenter.kv_cache.manager import KVCacheManager
from hitenter.request import Request, RequestStatus


@dataclass
class Draft:
    token_ids: list[int]


class Proposer(Protocol):
    steps_run: int    # sequential draft steps the last propose() ran (their cost is measured per step)

    def propose(self, reqs: Sequence[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
                generators: Sequence[torch.Generator | None]) -> list[Draft]: ...

    def release(self, request_id: str) -> None: ...

    @property
    def request_ids(self) -> list[str]:
        """Requests the proposer holds state for."""
        ...


def peek_seeds(generator: torch.Generator | None, n: int) -> list[int]:
    """The next n row seeds `generator` will give (sampler.row_seed), without advancing it (None: torch's
    global generator)."""
    g = torch.Generator()
    g.set_state((generator or torch.default_generator).get_state())
    return [row_seed(g) for _ in range(n)]


def stop_ids(req: Request) -> frozenset[int]:
    return req.eos_token_ids | frozenset(req.sampling_params.stop_token_ids or ())


class NgramProposer:
    """Prompt lookup decoding: continue the earlier occurrence of the longest suffix of the tokens.

    The suffix matched is the longest one (up to ``max_n`` tokens, at least ``min_n``) that occurred
    before in prompt + output; among equally long matches the latest wins. Up to k tokens that
    followed it are proposed."""

    steps_run = 1   # one lookup per propose() (the cost the draft-length controller measures per step)

    def __init__(self, min_n: int = 2, max_n: int = 16) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def match(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(start of the continuation, match length) of the longest earlier match of the suffix, (-1, 0)
        when no suffix of at least min_n tokens occurred before."""
        arr = np.asarray(tokens, dtype=np.int64)
        size = len(arr)
        if size < self.min_n + 1:
            return -1, 0
        # candidate ends: earlier positions e (with a follower: e < size - 1) holding the last token
        ends = np.flatnonzero(arr[:size - 1] == arr[size - 1])
        length = 1
        while len(ends) and length < self.max_n:
            ok = ends >= length
            ok[ok] = arr[ends[ok] - length] == arr[size - 1 - length]
            if not ok.any():
                break
            ends, length = ends[ok], length + 1
        if not len(ends) or length < self.min_n:
            return -1, 0
        return int(ends[-1]) + 1, length

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        start, _ = self.match(tokens)
        return [] if start < 0 else [int(t) for t in tokens[start:start + k]]

    def propose(self, reqs: Sequence[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
                generators: Sequence[torch.Generator | None]) -> list[Draft]:
        return [Draft(self.lookup(r.all_token_ids, k)) for r, k in zip(reqs, ks, strict=True)]

    def release(self, request_id: str) -> None:
        pass

    @property
    def request_ids(self) -> list[str]:
        return []


class DraftModelProposer:
    """A draft model on its own paged KV cache, kept in step with the target's verified tokens.

    `lookup`: prompt lookup first: a request whose last `lookup_min` or more tokens occurred before
    (prompt + output) gets what followed them, with no draft step (copying and editing text); the
    others are drafted by the model. `steps_run`: model steps the last propose() ran."""

    def __init__(self, runner: ModelRunner, kv: KVCacheManager, lookup: NgramProposer | None = None,
                 lookup_min: int = 4) -> None:
        self.runner = runner
        self.kv = kv
        self.lookup, self.lookup_min = lookup, lookup_min
        self.steps_run = 0
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

    def _looked_up(self, req: Request, k: int) -> Draft | None:
        if self.lookup is None:
            return None
        tokens = req.all_token_ids
        start, n = self.lookup.match(tokens)
        if start < 0 or n < self.lookup_min:
            return None
        return Draft([int(t) for t in tokens[start:start + k]])

    @torch.inference_mode()
    def propose(self, reqs: Sequence[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
                generators: Sequence[torch.Generator | None]) -> list[Draft]:
        drafts = [self._looked_up(r, k) for r, k in zip(reqs, ks, strict=True)]
        todo = [i for i, d in enumerate(drafts) if d is None]
        self.steps_run = 0
        if not todo:
            return drafts   # type: ignore[return-value]
        mirrors = [self._sync(reqs[i]) for i in todo]
        grammars = [reqs[i].extra.get("grammar") for i in todo]   # structured outputs: the draft obeys them too
        pushed = [0] * len(todo)
        try:
            got = self._draft(mirrors, [ks[i] for i in todo], chain, [generators[i] for i in todo], grammars,
                              pushed)
        finally:
            for g, n in zip(grammars, pushed, strict=True):
                if g is not None:
                    g.pop(n)        # the target's matchers back where verification expects them
        for i, d in zip(todo, got, strict=True):
            drafts[i] = d
        return drafts   # type: ignore[return-value]

    def _draft(self, mirrors: list[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
               generators: Sequence[torch.Generator | None], grammars: list[Any], pushed: list[int]) -> list[Draft]:
        """k autoregressive draft steps; a constrained request's draws are masked by its grammar, which
        is advanced over the drafted tokens (``pushed`` counts them, for the caller to roll back)."""
        limit = list(ks)
        toks: list[list[int]] = [[] for _ in mirrors]
        # a sampling request's draft j races with the seed its target row j will draw (peeked from a copy
        # of its generator: the request's own is not advanced here)
        seeds = [None if m.sampling_params.is_greedy else peek_seeds(g, k)
                 for m, g, k in zip(mirrors, generators, ks, strict=True)]
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
            self.steps_run += 1
            out = self.runner.execute(SchedulerOutput(0, scheduled, [], sum(s.num_new_tokens for s in scheduled)))
            assert out.logits is not None and len(out.sample_request_ids) == len(rows)
            for sr in scheduled:
                sr.request.num_computed_tokens += sr.num_new_tokens
            draw_drafts(chain, out.logits, mirrors, rows, seeds, toks, grammars, pushed)
        return [Draft(t) for t in toks]


def draw_drafts(chain: Sequence[LogitsProcessor], logits: torch.Tensor, mirrors: Sequence[Request],
                rows: Sequence[int], seeds: Sequence[list[int] | None], toks: list[list[int]], grammars: list[Any],
                pushed: list[int]) -> None:
    """Draw each request's next draft: ``logits[j]`` is mirror ``rows[j]``'s, put through the request's
    logits-processor chain (output history: its verified tokens + the drafts so far, the mirror's), then
    greedy (argmax) or, for a sampling request (``seeds[i]``: the row seeds its target rows will draw),
    the sampler's race with the seed of that draft's row. The token is appended to ``toks[i]`` and the
    mirror's outputs, and pushed into the request's grammar (``pushed[i]`` counts the pushes)."""
    sel = [mirrors[i] for i in rows]
    cons = [grammars[i] for i in rows]
    batch = BatchState([m.sampling_params for m in sel], [m.prompt_token_ids for m in sel],
                       [m.output_token_ids for m in sel], [stop_ids(m) for m in sel],
                       cons if any(c is not None for c in cons) else ())
    x, _ = run_chain(chain, logits, batch)
    for j, i in enumerate(rows):
        row_seeds = seeds[i]
        if row_seeds is None:
            tok = int(greedy_argmax(x[j]))
        else:
            tok = int(race(x[j:j + 1], [row_seeds[len(toks[i])]])[0])
        toks[i].append(tok)
        mirrors[i].output_token_ids.append(tok)
        if grammars[i] is not None and grammars[i].push(tok):
            pushed[i] += 1
