"""MTPProposer: the target file's own multi-token-prediction block (hitenter/models/mtp.py) as the drafter.

The block's row at position ``p`` reads the token at ``p`` and the target's hidden state (after its final
norm) at ``p - 1``, keeps K/V in its own one-layer paged cache, and its logits guess the token at
``p + 1``. Per request the proposer keeps:

- the target's hidden rows by position, taken from every forward of the engine (``observe_target``: the
  runner's ``ModelRunnerOutput.hidden``), until the block has consumed them;
- a mirror Request over the block's KV (its own KVCacheManager): ``num_computed_tokens`` is the number of
  leading positions whose K/V were computed from the target's own hidden states and verified tokens.

Prefix caching (``kv`` built with it): the block's K/V at position ``p`` depend only on the token at ``p``
and the target's row at ``p - 1``, itself a function of the tokens before ``p``, so the block's full blocks
are cached under the target's block-hash chain, and beside each one (``block_hidden``, by block id) the
target's row at its last position. A new mirror starts from its longest cached prefix: those positions'
K/V come back with the blocks and the row before the first recomputed position from the last hit block,
so a request resuming from the target's prefix cache or a state snapshot drafts what it drafts cold. A
block is cached only when every row in it read the target's own row: a position the target did not compute
here and no cached block covers (the block's cache evicted before the target's) reads zeros, as llama.cpp's
first row does, and its drafts only get worse; verification keeps the output exact whatever is drafted.

``propose``: with ``C`` the request's computed tokens (its newest token at position ``C`` not run yet),
the first draft step runs the block over positions ``valid .. C`` in one pass (the catch-up rows, then
``(token C, h C-1)``, whose logits give draft 1); step ``j`` runs one row, ``(draft j-1, the block's own
output of the row before)`` at ``C + j - 1`` (llama.cpp's chained MTP drafting). The requests being
drafted share each step's pass. After drafting, positions ``<= C`` stay valid; the rows computed from
drafts are recomputed from the target's hidden states once verification settles them. Drafts are drawn
as the draft model's are (proposers.draw_drafts: the request's logits processors, greedy or the seeded
race, grammars), on the first HITENTER_DRAFT_VOCAB ids of the shared LM head (draft_head.py; the head is
most of a block step's bytes: a vocabulary of 150k+ rows against one decoder layer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hitenter.engine.logits_processors import LogitsProcessor
from hitenter.engine.scheduler import SchedulerOutput
from hitenter.engine.speculative.proposers import Draft, draw_drafts, peek_seeds
from hitenter.kv_cache.manager import KVCacheManager
from hitenter.models.attention import AttentionMetadata
from hitenter.models.mtp import MTPHead
from hitenter.request import Request, RequestStatus


class MTPProposer:
    """Drafts with an MTPHead over its own paged KV cache (``kv``: its manager, ``cache``: its tensor)."""

    wants_hidden = True   # the engine hands it the target's hidden rows after each forward

    def __init__(self, head: MTPHead, kv: KVCacheManager, cache: torch.Tensor,
                 trimmed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """`trimmed`: scores the block's output rows on the first ids of the vocabulary only (draft_head.py's
        TrimmedHead over the target's head, which the block shares); None: the block's full head."""
        self.head, self.kv, self.cache, self.trimmed = head, kv, cache, trimmed
        self.steps_run = 0
        self._mirrors: dict[str, Request] = {}
        self._valid: dict[str, int] = {}
        self._hidden: dict[str, dict[int, torch.Tensor]] = {}
        self._zeros = torch.zeros(head.hidden_size)
        # the target's row at each cached block's last position, by block id (prefix caching only)
        self.block_hidden = torch.zeros(kv.num_blocks if kv.enable_prefix_caching else 0, head.hidden_size)
        self._cached: dict[str, int] = {}    # rid -> leading blocks of its mirror registered in the cache
        self._guessed: dict[str, int] = {}   # rid -> first position > 0 whose row read zeros for the target's row
        self._workspace: dict[torch.dtype, torch.Tensor] = {}

    @property
    def request_ids(self) -> list[str]:
        return list(self._mirrors.keys() | self._hidden.keys())

    def release(self, request_id: str) -> None:
        m = self._mirrors.pop(request_id, None)
        self._valid.pop(request_id, None)
        self._hidden.pop(request_id, None)
        self._cached.pop(request_id, None)
        self._guessed.pop(request_id, None)
        if m is not None:
            self.kv.free(m)

    def observe_target(self, sched: SchedulerOutput, hidden: torch.Tensor) -> None:
        """Keep the target's hidden rows of the step (rows in scheduled order) by position, for the
        requests that may be drafted for."""
        row = 0
        for sr in sched.scheduled:
            n = sr.num_new_tokens
            if sr.request.sampling_params.speculate:
                rows = hidden[row:row + n].float().clone()
                store = self._hidden.setdefault(sr.request.request_id, {})
                for j in range(n):
                    store[sr.num_computed_tokens + j] = rows[j]
            row += n

    def _h(self, rid: str, pos: int) -> torch.Tensor:
        """The target's row at `pos` (zeros before position 0, or where it is unknown: noted in _guessed)."""
        if pos < 0:
            return self._zeros
        h = self._hidden.get(rid, {}).get(pos)
        if h is None:
            self._guessed[rid] = min(self._guessed.get(rid, pos + 1), pos + 1)
            return self._zeros
        return h

    def _sync(self, req: Request) -> Request:
        """The request's mirror: its verified tokens, the block's KV kept for the valid positions."""
        rid = req.request_id
        m = self._mirrors.get(rid)
        if m is None:
            m = Request(rid, list(req.prompt_token_ids), req.sampling_params, req.max_tokens, req.eos_token_ids,
                        status=RequestStatus.RUNNING, images=req.images)
            m.output_token_ids[:] = req.output_token_ids
            self._mirrors[rid] = m
            self._resume(m)
        m.output_token_ids[:] = req.output_token_ids
        m.num_computed_tokens = min(self._valid.get(rid, 0), req.num_computed_tokens)
        self.kv.trim(m, m.num_computed_tokens)
        return m

    @torch.inference_mode()
    def propose(self, reqs: Sequence[Request], ks: Sequence[int], chain: Sequence[LogitsProcessor],
                generators: Sequence[torch.Generator | None]) -> list[Draft]:
        self.steps_run = 0
        mirrors = [self._sync(r) for r in reqs]
        computed = [r.num_computed_tokens for r in reqs]
        grammars = [r.extra.get("grammar") for r in reqs]
        pushed = [0] * len(reqs)
        try:
            toks = self._draft(mirrors, computed, list(ks), chain, generators, grammars, pushed)
        finally:
            for g, n in zip(grammars, pushed, strict=True):
                if g is not None:
                    g.pop(n)        # the target's matchers back where verification expects them
        for m, c in zip(mirrors, computed, strict=True):
            self._cache(m, c)
        for r, c in zip(reqs, computed, strict=True):
            store = self._hidden.get(r.request_id)
            if store:   # rows before C - 1 are consumed (position C + 1 reads h C onwards)
                for p in [p for p in store if p < c]:
                    del store[p]
        return [Draft(t) for t in toks]

    def _resume(self, m: Request) -> None:
        """A new mirror takes its longest cached prefix: those positions' K/V, and the target's row at the
        last hit position (which the first recomputed row reads)."""
        if not self.kv.enable_prefix_caching:
            return
        hits, n = self.kv.get_computed_blocks(m)
        if not hits or self.kv.allocate_slots(m, 0, hits) is None:
            return
        rid = m.request_id
        m.num_computed_tokens = self._valid[rid] = n
        self._cached[rid] = len(hits)
        self._hidden.setdefault(rid, {}).setdefault(n - 1, self.block_hidden[hits[-1]].clone())

    def _cache(self, m: Request, computed: int) -> None:
        """Register the mirror's full blocks whose rows all read the target's own rows, each with the
        target's row at its last position (known for positions before `computed`)."""
        rid = m.request_id
        if not self.kv.enable_prefix_caching:
            return
        bs, store = self.kv.block_size, self._hidden.get(rid, {})
        end = min(computed, self._valid.get(rid, 0), self._guessed.get(rid, computed))
        table, done = self.kv.block_table(rid), self._cached.get(rid, 0)
        while done < min(end // bs, len(table)):
            h = store.get((done + 1) * bs - 1)
            if h is None:
                break
            self.block_hidden[table[done]] = h
            done += 1
        if done > self._cached.get(rid, 0):
            self._cached[rid] = done
            self.kv.cache_blocks(m, done * bs)

    def _draft(self, mirrors: list[Request], computed: list[int], limit: list[int],
               chain: Sequence[LogitsProcessor], generators: Sequence[torch.Generator | None], grammars: list[Any],
               pushed: list[int]) -> list[list[int]]:
        toks: list[list[int]] = [[] for _ in mirrors]
        seeds = [None if m.sampling_params.is_greedy else peek_seeds(g, k)
                 for m, g, k in zip(mirrors, generators, limit, strict=True)]
        own: list[torch.Tensor | None] = [None] * len(mirrors)   # the block's output row of the last draft step
        for step in range(max(limit, default=0)):
            rows, ids, hs, pos, slots, qsl, lens, tables = [], [], [], [], [], [0], [], []
            bs = self.kv.block_size
            for i, m in enumerate(mirrors):
                if len(toks[i]) >= limit[i]:
                    continue
                start = m.num_computed_tokens
                n = m.num_tokens - start
                if self.kv.allocate_slots(m, n) is None:   # its cache is full: no more drafts for it
                    limit[i] = len(toks[i])
                    continue
                table = self.kv.block_table(m.request_id)
                ids += m.token_slice(start, start + n)
                if step == 0:
                    hs += [self._h(m.request_id, p - 1) for p in range(start, start + n)]
                else:
                    hs.append(own[i])   # type: ignore[arg-type]
                pos += range(start, start + n)
                slots += [table[p // bs] * bs + p % bs for p in range(start, start + n)]
                qsl.append(qsl[-1] + n)
                lens.append(start + n)
                tables.append(table)
                rows.append(i)
            if not rows:
                break
            self.steps_run += 1
            meta = AttentionMetadata(qsl, lens, tables, torch.tensor(slots, dtype=torch.long), bs,
                                     workspace=self._workspace)
            out = self.head(torch.tensor(ids, dtype=torch.long), torch.stack(hs), torch.tensor(pos, dtype=torch.long),
                            meta, self.cache)
            last = out[torch.tensor([e - 1 for e in qsl[1:]], dtype=torch.long)]
            for j, i in enumerate(rows):
                m = mirrors[i]
                m.num_computed_tokens = lens[j]
                if step == 0:   # positions <= C were computed from the target's own rows
                    self._valid[m.request_id] = computed[i] + 1
                own[i] = last[j]
            logits = self.trimmed(last) if self.trimmed is not None else self.head.compute_logits(last)
            draw_drafts(chain, logits, mirrors, rows, seeds, toks, grammars, pushed)
        return toks
