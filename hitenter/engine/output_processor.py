"""The output processor: what a step's new tokens mean to the caller, built incrementally.

The scheduler's ``update`` appends the sampled tokens and decides token stops (EOS, stop ids,
max_tokens). This module owns the rest, per request group (the n sequences of one request):
detokenizing, stop strings (they may span tokens: the detokenizer matches on the text), logprobs
(decoded only for requests that asked), timings, and the RequestOutputs (hitenter/outputs.py).

Incremental: each sequence keeps append-only lists (token ids are the Request's own, text pieces,
logprobs, token times) and an output is built from ``Prefix`` / ``Joined`` views of them, so a step's
cost is per new token and per touched request, never per token already produced (the reader of a
cumulative field pays for its copy, once). It runs after the engine's step, in the engine's thread
and under no lock: callers never wait on it (see async_engine.py).

A stop string found here finishes the request through ``finish`` (the engine frees its blocks at once)
and drops the tokens after the stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hitenter.engine.sampler import StepSample
from hitenter.outputs import (
    CompletionOutput,
    Joined,
    PositionLogprobs,
    Prefix,
    RequestMetricsSnapshot,
    RequestOutput,
    TokenLogprob,
)
from hitenter.request import Request, RequestStatus
from hitenter.sampling_params import SamplingParams
from hitenter.tokenizer.detokenizer import IncrementalDetokenizer

Finish = Callable[[str, RequestStatus], None]


@dataclass(eq=False)
class SeqState:
    """One sequence (one of the n completions of a request)."""

    request: Request
    group: GroupState
    index: int
    detok: IncrementalDetokenizer
    pieces: list[str] = field(default_factory=list)          # text, append-only
    logprobs: list[PositionLogprobs] | None = None           # append-only, when asked
    num_seen: int = 0                                        # output tokens already processed
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[PositionLogprobs] | None = None


@dataclass(eq=False)
class GroupState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[SeqState] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.request.is_finished for s in self.seqs)


class OutputProcessor:
    def __init__(self, tokenizer: Any, finish: Finish, extras: Callable[[GroupState], dict[str, Any]] | None = None):
        self.tokenizer = tokenizer
        self.finish = finish            # ends a request in the scheduler (frees its blocks)
        self.extras = extras            # RequestOutput.extra of a group (speculation stats, ...)
        self.groups: dict[str, GroupState] = {}
        self.seqs: dict[str, SeqState] = {}

    # ---- requests --------------------------------------------------------------------------------
    def new_group(self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams,
                  requests: Sequence[Request]) -> GroupState:
        """The group's state (not registered until ``add``)."""
        g = GroupState(request_id, prompt, prompt_ids, params)
        tok = self.tokenizer
        for j, req in enumerate(requests):
            detok = IncrementalDetokenizer(tok.token_bytes, tok.is_special, params)
            g.seqs.append(SeqState(req, g, j, detok, logprobs=[] if params.logprobs is not None else None))
        return g

    def add(self, group: GroupState) -> None:
        self.groups[group.request_id] = group
        for s in group.seqs:
            self.seqs[s.request.request_id] = s

    def remove(self, request_id: str) -> GroupState | None:
        """Forget a group (finished or aborted); returns it, or None for an unknown id."""
        g = self.groups.pop(request_id, None)
        if g is not None:
            for s in g.seqs:
                self.seqs.pop(s.request.request_id, None)
        return g

    # ---- the step's outputs ----------------------------------------------------------------------
    def process(self, request_ids: Sequence[str], sampled: StepSample | None) -> list[RequestOutput]:
        """Outputs of the groups whose sequences got tokens this step (``request_ids`` and ``sampled``
        as the runner and sampler returned them; the scheduler already appended the kept tokens)."""
        if sampled is None:
            return []
        now = time.monotonic()
        touched: list[GroupState] = []
        for i, rid in enumerate(request_ids):
            seq = self.seqs.get(rid)
            if seq is None:
                continue
            self._on_tokens(seq, sampled.logprobs[i], now)
            if not touched or touched[-1] is not seq.group:
                if seq.group not in touched:
                    touched.append(seq.group)
        outputs = [self._output(g) for g in touched]
        for g in touched:
            if g.finished:
                self.remove(g.request_id)
        return outputs

    def _on_tokens(self, seq: SeqState, lps: Sequence[Any], now: float) -> None:
        req = seq.request
        out = req.output_token_ids
        new = len(out) - seq.num_seen
        m = req.metrics
        if new > 0 and m.first_token_time is None:
            m.first_token_time = now
        token_stop = req.is_finished and req.finish_reason in ("stop", "length")
        for j in range(new):
            tok = out[seq.num_seen]
            seq.num_seen += 1
            m.token_times.append(now)
            seq.delta_token_ids.append(tok)
            lp = lps[j] if j < len(lps) else None
            if lp is not None and seq.logprobs is not None:
                pos = self._position_logprobs(lp)
                seq.logprobs.append(pos)
                if seq.delta_logprobs is None:
                    seq.delta_logprobs = []
                seq.delta_logprobs.append(pos)
            last = seq.num_seen == len(out)
            if self._detokenize(seq, tok, last and token_stop):
                break
        if token_stop and seq.num_seen == len(out):
            self._text(seq, seq.detok.flush())
            m.finished_time = now

    def _detokenize(self, seq: SeqState, tok: int, stopped_here: bool) -> bool:
        """Add one token's text; True when a stop string matched (the sequence then ends at this token)."""
        req = seq.request
        if stopped_here and req.finish_reason == "stop" and not req.sampling_params.include_stop_str_in_output:
            return False        # an EOS / stop id contributes no text
        d = seq.detok.add(tok)
        self._text(seq, d.text)
        if d.stop_string is None:
            return False
        del req.output_token_ids[seq.num_seen:]      # tokens after the stop (a speculative run) go
        if req.is_finished:                           # max_tokens reached on this very token: the stop string wins
            req.status = RequestStatus.FINISHED_STOPPED
        else:
            self.finish(req.request_id, RequestStatus.FINISHED_STOPPED)
        req.stop_reason = d.stop_string
        req.metrics.finished_time = time.monotonic()
        return True

    @staticmethod
    def _text(seq: SeqState, text: str) -> None:
        if text:
            seq.pieces.append(text)
            seq.delta_text += text

    def _position_logprobs(self, lp: Any) -> PositionLogprobs:
        dec = self.tokenizer.decode
        chosen = TokenLogprob(lp.token_id, lp.logprob, lp.rank, dec([lp.token_id]))
        return PositionLogprobs(chosen, [TokenLogprob(t, v, r, dec([t])) for t, v, r in lp.top])

    def _output(self, g: GroupState) -> RequestOutput:
        comps = []
        for s in g.seqs:
            r = s.request
            comps.append(CompletionOutput(
                s.index, Joined(s.pieces, len(s.pieces)), Prefix(r.output_token_ids, len(r.output_token_ids)),
                r.finish_reason, r.stop_reason,
                None if s.logprobs is None else Prefix(s.logprobs, len(s.logprobs)),  # type: ignore[arg-type]
                s.delta_text, s.delta_token_ids, s.delta_logprobs))
            s.delta_text, s.delta_token_ids, s.delta_logprobs = "", [], None
        first = g.seqs[0].request
        m = first.metrics
        preemptions = m.num_preemptions if len(g.seqs) == 1 else sum(s.request.metrics.num_preemptions
                                                                    for s in g.seqs)
        snap = RequestMetricsSnapshot(m.arrival_time, m.queue_time, m.time_to_first_token,
                                      Prefix(m.token_times, len(m.token_times)),  # type: ignore[arg-type]
                                      m.finished_time, preemptions)
        extra = self.extras(g) if self.extras is not None else {}
        cached = first.num_cached_tokens if len(g.seqs) == 1 else max(s.request.num_cached_tokens for s in g.seqs)
        return RequestOutput(g.request_id, g.prompt, g.prompt_token_ids, comps, g.finished, cached, snap, extra)
