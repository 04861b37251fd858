"""LLMEngine: requests in, RequestOutputs out. ``step()`` is four calls: schedule, run, sample, update
(with speculative decoding, a proposer drafts tokens before ``schedule`` and a step may emit several
tokens per request; each goes through the same per-token post-processing, in order)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hitenter.engine.engine_setup import EngineParts, build_engine_parts
from hitenter.engine.events import EngineEvent, EventBus, ScheduledWork
from hitenter.engine.model_runner import ModelRunnerOutput
from hitenter.engine.request import Request, RequestStatus
from hitenter.engine.sampler import SamplingMetadata, StepSample, make_generator
from hitenter.engine.scheduler import SchedulerOutput
from hitenter.engine.spec import SpecDecodeStats, spec_request_stats
from hitenter.engine.stopping import check_token_stop
from hitenter.engine.structured import backend_for, constraints_of
from hitenter.errors import ContextOverflowError
from hitenter.outputs import (
    CompletionOutput,
    PositionLogprobs,
    RequestMetricsSnapshot,
    RequestOutput,
    TokenLogprob,
)
from hitenter.sampling_params import SamplingParams
from hitenter.tokenizer.detokenizer import IncrementalDetokenizer


@dataclass
class _Seq:
    """Engine-side state of one sequence (one of the n completions of a request)."""

    request: Request
    group: _Group
    index: int
    detok: IncrementalDetokenizer
    generator: torch.Generator | None
    text: str = ""
    logprobs: list[PositionLogprobs] | None = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[PositionLogprobs] | None = None


@dataclass
class _Group:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[_Seq] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.request.is_finished for s in self.seqs)


class LLMEngine:
    def __init__(self, model: str | None = None, **kwargs: object) -> None:
        parts: EngineParts = build_engine_parts(model, **kwargs)
        self.parts = parts
        self.model_config = parts.model_config
        self.tokenizer = parts.tokenizer
        self.scheduler = parts.scheduler
        self.kv_manager = parts.kv_manager
        self.runner = parts.runner
        self.sampler = parts.sampler
        self.max_model_len = parts.max_model_len
        self.spec = parts.spec
        self.spec_decode: SpecDecodeStats | None = parts.spec.stats if parts.spec is not None else None
        self.disagg = parts.disagg          # disaggregated prefill's client (hitenter/distributed/disagg.py)
        self.events = EventBus()
        self.step_counter = 0
        self._groups: dict[str, _Group] = {}
        self._seqs: dict[str, _Seq] = {}
        self._ids = itertools.count()
        self._kv_events: list[object] = []
        self.kv_manager.on_event = self._kv_events.append
        self.trace_requests: set[str] = set()     # request ids whose sampling trace is wanted
        self.last_traces: dict[str, object] = {}

    # ---- requests -------------------------------------------------------------------------
    def make_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        ids = list(prompt)
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"prompt: token ids must be integers in 0..{self.model_config.vocab_size - 1}, got {bad[:5]}")
        return ids

    def resolve_max_tokens(self, n_prompt: int, params: SamplingParams) -> int:
        """max_tokens with the context window applied; raises ContextOverflowError, never truncates."""
        n_ctx = self.max_model_len
        if params.max_tokens is None:
            if n_prompt >= n_ctx:
                raise ContextOverflowError(n_prompt, n_ctx)
            return n_ctx - n_prompt
        if n_prompt + params.max_tokens > n_ctx:
            raise ContextOverflowError(n_prompt, n_ctx, params.max_tokens)
        return params.max_tokens

    def add_request(self, request_id: str | None, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> str:
        """Validate and queue a request (n sequences). Raises ValueError/ContextOverflowError before any work."""
        request_id = request_id or self.make_request_id()
        if request_id in self._groups:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        prompt_ids = self.encode_prompt(prompt)
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        params.validate_for_vocab(self.model_config.vocab_size)
        max_tokens = self.resolve_max_tokens(len(prompt_ids), params)
        group = _Group(request_id, prompt if isinstance(prompt, str) else None, prompt_ids, params)
        eog = frozenset() if params.ignore_eos else self.tokenizer.eog_token_ids
        for j in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{j}"
            req = Request(rid, list(prompt_ids), params, max_tokens, eos_token_ids=eog)
            if arrival_time is not None:
                req.metrics.arrival_time = arrival_time
            gen = None if params.is_greedy else make_generator(None if params.seed is None else params.seed + j)
            detok = IncrementalDetokenizer(self.tokenizer.token_bytes, self.tokenizer.is_special, params)
            seq = _Seq(req, group, j, detok, gen, logprobs=[] if params.logprobs is not None else None)
            if params.guided is not None:     # structured outputs: this sequence's grammar matcher
                req.extra["grammar"] = backend_for(self.tokenizer, self.model_config.vocab_size).constraint(params.guided)
            group.seqs.append(seq)
        remote = self.disagg is not None and len(prompt_ids) > 1   # the prefill worker computes prompt[:-1]
        if remote:
            self.disagg.check()
        for seq in group.seqs:    # add all or nothing: QueueFullError leaves no trace
            self.scheduler.add_request(seq.request, remote=remote)
            self._seqs[seq.request.request_id] = seq
        self._groups[request_id] = group
        if remote:
            try:
                self.disagg.submit([s.request for s in group.seqs])
            except BaseException:
                self.abort(request_id)
                raise
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks at once. Unknown ids are ignored."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return
        for seq in group.seqs:
            if not seq.request.is_finished:
                self.scheduler.finish_request(seq.request.request_id, RequestStatus.FINISHED_ABORTED)
            self._seqs.pop(seq.request.request_id, None)
            self.trace_requests.discard(seq.request.request_id)
            if self.disagg is not None:
                self.disagg.discard(seq.request.request_id)
            if self.spec is not None:
                self.spec.release(seq.request.request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        if self.disagg is not None:   # prompts whose KV arrived become schedulable; raises if the worker failed
            self.disagg.poll(self.scheduler)
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, {rid: s.generator for rid, s in self._seqs.items()},
                              self.sampler)
        sched = self.scheduler.schedule()
        ran = self.runner.execute(sched)
        sampled = self._sample(ran)
        return self._update(sched, ran, sampled, t0)

    def _sample(self, ran: ModelRunnerOutput) -> StepSample | None:
        if ran.logits is None:
            return None
        seqs = [self._seqs[rid] for rid in ran.sample_request_ids]
        want_trace = any(rid in self.trace_requests for rid in ran.sample_request_ids)
        if self.spec is not None and any(n > 1 for n in ran.num_rows):
            return self.spec.sample(ran.logits, ran.num_rows, [s.request for s in seqs],
                                    [s.generator for s in seqs], self.sampler, trace=want_trace)
        meta = SamplingMetadata(
            params=[s.request.sampling_params for s in seqs],
            generators=[s.generator for s in seqs],
            prompt_token_ids=[s.request.prompt_token_ids for s in seqs],
            output_token_ids=[s.request.output_token_ids for s in seqs],
            stop_token_ids=[s.request.eos_token_ids | frozenset(s.request.sampling_params.stop_token_ids or ())
                            for s in seqs],
            constraints=constraints_of([s.request for s in seqs]),
        )
        return StepSample.from_sampler(self.sampler(ran.logits, meta, trace=want_trace))

    def _update(self, sched: SchedulerOutput, ran: ModelRunnerOutput, sampled: StepSample | None,
                t0: float) -> list[RequestOutput]:
        new_tokens: dict[str, list[int]] = {}
        if sampled is not None:
            for i, rid in enumerate(ran.sample_request_ids):
                new_tokens[rid] = sampled.token_ids[i]
                if sampled.trace is not None and sampled.trace[i] is not None and rid in self.trace_requests:
                    self.last_traces[rid] = sampled.trace[i]
        self.scheduler.update(sched, new_tokens)
        now = time.monotonic()
        touched: dict[str, _Group] = {}
        finished: list[tuple[str, str]] = []
        for i, rid in enumerate(ran.sample_request_ids):
            seq = self._seqs.get(rid)
            if seq is None:
                continue
            assert sampled is not None
            toks, req = sampled.token_ids[i], seq.request
            base = req.num_output_tokens - len(toks)      # update() appended them all; post-process in order
            for j, tok in enumerate(toks):
                self._on_token(seq, tok, sampled.logprobs[i][j], now, base + j + 1)
                if req.is_finished:                        # a stop inside an accepted run ends it there
                    del req.output_token_ids[base + j + 1:]
                    break
            touched[seq.group.request_id] = seq.group
            if req.is_finished:
                finished.append((rid, req.finish_reason or ""))
                if self.spec is not None:
                    self.spec.release(rid)
        outputs = [self._make_output(g) for g in touched.values()]
        for g in touched.values():
            if g.finished:
                self._groups.pop(g.request_id, None)
                for s in g.seqs:
                    self._seqs.pop(s.request.request_id, None)
        self._publish(sched, ran, new_tokens, finished, t0)
        return outputs

    def _on_token(self, seq: _Seq, token: int, lp: object, now: float, num_output: int) -> None:
        req = seq.request
        m = req.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.token_times.append(now)
        params = req.sampling_params
        seq.delta_token_ids.append(token)
        if "grammar" in req.extra:
            req.extra["grammar"].accept(token)
        if lp is not None and seq.logprobs is not None:
            pos = self._to_position_logprobs(lp)
            seq.logprobs.append(pos)
            seq.delta_logprobs = (seq.delta_logprobs or []) + [pos]
        stop = check_token_stop(token, num_output, params, req.eos_token_ids, req.max_tokens)
        text = ""
        if stop is None or stop[0] == "length" or params.include_stop_str_in_output:
            d = seq.detok.add(token)
            text = d.text
            if d.stop_string is not None:
                stop = ("stop", d.stop_string)
        if stop is not None:
            if not isinstance(stop[1], str):     # a matched stop string already truncated the text
                text += seq.detok.flush()
            status = RequestStatus.FINISHED_LENGTH if stop[0] == "length" else RequestStatus.FINISHED_STOPPED
            req.stop_reason = stop[1]
            m.finished_time = now
            self.scheduler.finish_request(req.request_id, status)
        seq.text += text
        seq.delta_text += text

    def _to_position_logprobs(self, lp: object) -> PositionLogprobs:
        dec = self.tokenizer.decode
        chosen = TokenLogprob(lp.token_id, lp.logprob, lp.rank, dec([lp.token_id]))  # type: ignore[attr-defined]
        top = [TokenLogprob(t, v, r, dec([t])) for t, v, r in lp.top]  # type: ignore[attr-defined]
        return PositionLogprobs(chosen, top)

    def _make_output(self, g: _Group) -> RequestOutput:
        comps = []
        for s in g.seqs:
            r = s.request
            comps.append(CompletionOutput(
                index=s.index, text=s.text, token_ids=list(r.output_token_ids),
                finish_reason=r.finish_reason, stop_reason=r.stop_reason,
                logprobs=list(s.logprobs) if s.logprobs is not None else None,
                delta_text=s.delta_text, delta_token_ids=s.delta_token_ids, delta_logprobs=s.delta_logprobs,
            ))
            s.delta_text, s.delta_token_ids, s.delta_logprobs = "", [], None
        m = g.seqs[0].request.metrics
        snap = RequestMetricsSnapshot(m.arrival_time, m.queue_time, m.time_to_first_token, list(m.token_times),
                                      m.finished_time, sum(s.request.metrics.num_preemptions for s in g.seqs))
        extra = {}
        if self.spec is not None:
            extra["spec_decode"] = spec_request_stats([s.request for s in g.seqs])
        if "disaggregated" in g.seqs[0].request.extra:   # prefill worker timings (prefill, transfer)
            extra["disaggregated"] = g.seqs[0].request.extra["disaggregated"]
        return RequestOutput(g.request_id, g.prompt, g.prompt_token_ids, comps, g.finished,
                             max(s.request.num_cached_tokens for s in g.seqs), snap, extra)

    def _publish(self, sched: SchedulerOutput, ran: ModelRunnerOutput, new_tokens: dict[str, list[int]],
                 finished: list[tuple[str, str]], t0: float) -> None:
        self.step_counter += 1 if sched.scheduled else 0
        kv_events, self._kv_events[:] = list(self._kv_events), []
        if not self.events.active:
            return
        work = []
        for sr in sched.scheduled:
            r = sr.request
            kind = "decode" if sr.num_computed_tokens >= r.num_prompt_tokens else "prefill"
            tok = new_tokens.get(r.request_id)
            work.append(ScheduledWork(r.request_id, sr.num_computed_tokens, sr.num_new_tokens, kind,
                                      tok[0] if tok else None, list(tok or ())))
        self.events.publish(EngineEvent(
            step_id=sched.step_id, t_start=t0, t_end=time.perf_counter(), t_model=ran.t_model, work=work,
            kv_events=kv_events, finished=finished, preempted=[r.request_id for r in sched.preempted],
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            kv_usage=self.kv_manager.usage, num_free_blocks=self.kv_manager.num_free_blocks,
        ))

    def subscribe(self, fn: Callable[[EngineEvent], None]) -> Callable[[], None]:
        return self.events.subscribe(fn)
