"""LLMEngine: requests in, RequestOutputs out.

``step()`` drains the inbox (arrivals and aborts from other threads), then schedule -> run -> sample ->
update (the scheduler appends tokens and decides token stops) -> output (the output processor:
detokenizing, stop strings, logprobs, n-groups; hitenter/engine/output_processor.py), then publishes
the step's events and a snapshot of its state (hitenter/engine/snapshot.py). The model run of a step
that scheduled work holds the process's ``cpu_share.forward`` (hitenter/engine/cpu_share.py: the
engines of one process take turns on its cores; the step's Python work around it, sampling and
detokenizing, may overlap another engine's forward), and every step tells the arbiter whether this
engine has generation requests.

Threads: ``add_request`` / ``abort`` / ``step`` belong to the thread that steps the engine (LLM.generate's,
or AsyncLLMEngine's loop). Other threads call ``prepare_request`` + ``submit`` and ``request_abort``
(queued, applied at the top of the next step) and read ``snapshot()``: none of them waits on a step.
Speculative decoding (a proposer drafts tokens before ``schedule``; a step may then emit several
tokens per request) and disaggregated prefill (prompts whose KV arrived become schedulable) hook in
before the schedule.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from hitenter.config import EngineConfig
from hitenter.engine.cpu_share import process_share
from hitenter.engine.engine_setup import EngineParts, build_engine_parts
from hitenter.engine.events import EngineEvent, EventBus, step_event
from hitenter.engine.image_prompt import ImagePrompt, image_prompt
from hitenter.engine.intake import Inbox, PendingRequest, encode_prompt, make_requests, resolve_max_tokens
from hitenter.engine.model_runner import ModelRunnerOutput
from hitenter.engine.output_processor import GroupState, OutputProcessor
from hitenter.engine.sampler import SamplingMetadata, StepSample
from hitenter.engine.scheduler import SchedulerOutput
from hitenter.engine.snapshot import KV_VIEW_TTL_S, EngineSnapshot, take_snapshot
from hitenter.engine.speculative import SpecDecodeStats, spec_request_stats
from hitenter.engine.structured import GrammarConstraint, constraints_of
from hitenter.engine.thinking_gate import ThinkingGate, constraint_for
from hitenter.outputs import RequestOutput
from hitenter.request import ImageRun, Request, RequestStatus
from hitenter.sampling_params import SamplingParams

log = logging.getLogger("hitenter.engine")


class LLMEngine:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None, **options: Any) -> None:
        """``LLMEngine(config=EngineConfig(...))``, or flat options: ``LLMEngine("model.gguf", max_num_seqs=8)``."""
        if config is None:
            config = EngineConfig.from_options(model, **options)
        elif model is not None or options:
            raise TypeError("pass either config or model / options, not both")
        self.config = config
        parts: EngineParts = build_engine_parts(config)
        self.parts = parts
        self.plan = parts.plan
        self.model_config, self.tokenizer = parts.model_config, parts.tokenizer
        self.scheduler, self.kv_manager = parts.scheduler, parts.kv_manager
        self.runner, self.sampler = parts.runner, parts.sampler
        self.max_model_len = parts.max_model_len
        self.vision = parts.vision          # the vision encoder's cache (runs / hits counters); None without one
        self.spec = parts.spec
        self.spec_decode: SpecDecodeStats | None = parts.spec.stats if parts.spec is not None else None
        # prompts prefilled beside the steps: the disaggregated worker's client (hitenter/distributed/disagg.py)
        # or the side prefill (hitenter/engine/side_prefill.py); ``disagg``: the former only
        self.prefiller = parts.prefiller
        self.disagg = parts.prefiller if config.parallel.disaggregate is not None else None
        self.events = EventBus()
        self.cpu_share = process_share()      # the process's cores, shared with its other engines
        self._stopped: list[Request] = []         # finished by a stop string this step
        # callbacks that do not hold the engine: a dropped engine is freed at once (its KV cache with it)
        self.output_processor = OutputProcessor(self.tokenizer, _finisher(self.scheduler, self.spec, self._stopped),
                                                _extras(self.spec))
        self.inbox = Inbox()
        self.on_reject: Callable[[str, BaseException], None] | None = None   # a queued arrival refused
        self.step_counter = 0
        self._ids = itertools.count()
        self._kv_events: list[object] = []
        self.kv_manager.on_event = self._kv_events.append
        self.trace_requests: set[str] = set()     # request ids whose sampling trace is wanted
        self.last_traces: dict[str, object] = {}
        self._kv_view_until = 0.0
        self._published = threading.Condition()
        self._snapshot = take_snapshot(self.scheduler, self.kv_manager, 0, True)
        # The playground's hook: the raw logits row of each traced request's latest sampled step (its
        # first row when speculating), kept so sliders can re-shape it without a model run. Consumers pop.
        self.last_logits: dict[str, object] = {}
        self._grammars: list[tuple[int, GrammarConstraint | ThinkingGate]] = []   # this step's constrained rows

    # ---- requests (prepare / submit / request_abort / snapshot: any thread) --------------------------------
    def make_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        return encode_prompt(self.tokenizer, self.model_config.vocab_size, prompt)

    def resolve_max_tokens(self, n_prompt: int, params: SamplingParams) -> int:
        return resolve_max_tokens(self.max_model_len, n_prompt, params)

    def image_prompt(self, segments: str | list[tuple[str, bool]], images: list[Any],
                     add_bos: bool | None = None) -> ImagePrompt:
        """A prompt holding images (hitenter/engine/image_prompt.py): `segments` (a text, or a chat template's
        (text, markup) segments) with one MEDIA_MARKER per image, `images` [H, W, 3] uint8 RGB arrays. Each
        image is preprocessed here (the caller's thread); the encoder runs in the step that computes its
        rows. ValueError without a vision encoder (naming --mmproj) or for a marker / image count mismatch."""
        encoder = self.require_vision()
        inputs = [encoder.prepare(rgb) for rgb in images]
        segs = [(segments, True)] if isinstance(segments, str) else segments
        return image_prompt(self.tokenizer, segs, inputs, encoder, [encoder.content_key(x) for x in inputs],
                            add_bos)

    def require_vision(self) -> Any:
        """The vision encoder; ValueError naming the fix when none is loaded."""
        if self.vision is None:
            raise ValueError(f"images: the model {self.parts.model_path} has no vision encoder loaded; start it "
                             "with its projector file (--mmproj mmproj.gguf, or mmproj=... in Python), or put "
                             "the mmproj*.gguf beside the model")
        return self.vision.encoder

    def prepare_request(self, request_id: str | None, prompt: str | list[int] | ImagePrompt, params: SamplingParams,
                        arrival_time: float | None = None) -> PendingRequest:
        """Validate and tokenize (once). Raises ValueError / ContextOverflowError (ValueError for any request
        to an encoder, which only embeds); touches no engine state. An ImagePrompt (``image_prompt``) carries
        its images' runs into the requests."""
        if not self.model_config.causal:
            raise ValueError(f"model: this is an embedding model ({self.model_config.architecture}, pooling "
                             f"{self.model_config.pooling or 'none'}); it does not generate text: use "
                             "/v1/embeddings (or /v1/rerank for a reranker)")
        request_id = request_id or self.make_request_id()
        runs: tuple[ImageRun, ...] = ()
        if isinstance(prompt, ImagePrompt):
            self.require_vision()
            prompt, runs = prompt.ids, prompt.runs
        prompt_ids = self.encode_prompt(prompt)
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        params.validate_for_vocab(self.model_config.vocab_size)
        max_tokens = self.resolve_max_tokens(len(prompt_ids), params)
        eog = frozenset() if params.ignore_eos else self.tokenizer.eog_token_ids
        reqs = make_requests(request_id, prompt_ids, params, max_tokens, eog, arrival_time)
        for r in reqs:
            r.images = runs
        if params.structured is not None or params.thinking is not None:
            # structured outputs / a thinking budget: one constraint per sequence (thinking_gate.py)
            for r in reqs:
                r.extra["grammar"] = constraint_for(params, prompt_ids, self.tokenizer, self.model_config.vocab_size)
        group = self.output_processor.new_group(request_id, prompt if isinstance(prompt, str) else None,
                                                prompt_ids, params, reqs)
        return PendingRequest(group)

    def submit(self, pending: PendingRequest) -> None:
        """Queue a prepared request for the engine thread (admitted at the top of the next step)."""
        self.inbox.put_add(pending)

    def request_abort(self, request_id: str) -> None:
        """Queue an abort (applied, blocks freed, at the top of the next step)."""
        self.inbox.put_abort(request_id)

    def snapshot(self, kv_blocks: bool = False, wait_s: float = 1.0) -> EngineSnapshot:
        """The state published after the last step. ``kv_blocks``: the block map is wanted (published after
        every step for KV_VIEW_TTL_S from now, and always while an event subscriber listens); only when
        the latest snapshot has none (the first read after a quiet spell) this waits for the next
        publication, at most ``wait_s`` (an idle engine publishes within IDLE_WAIT_S)."""
        if not kv_blocks:
            return self._snapshot
        self._kv_view_until = time.monotonic() + KV_VIEW_TTL_S
        with self._published:
            if self._snapshot.kv_blocks is None:
                self._published.wait_for(lambda: self._snapshot.kv_blocks is not None, wait_s)
        return self._snapshot

    # ---- requests (engine thread) ----------------------------------------------------------------------
    def add_request(self, request_id: str | None, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> str:
        """Validate and queue a request (n sequences). Raises ValueError/ContextOverflowError/QueueFullError."""
        pending = self.prepare_request(request_id, prompt, params, arrival_time)
        self.admit(pending)
        return pending.request_id

    def admit(self, pending: PendingRequest) -> None:
        group, rid = pending.group, pending.request_id
        if rid in self.output_processor.groups:
            raise ValueError(f"request_id: {rid!r} is already in use")
        first = group.seqs[0].request
        # a prompt with images is prefilled by the steps (the runner holds the encoder)
        remote = self.prefiller is not None and not first.images and self.prefiller.takes(first, self.scheduler)
        if remote:
            self.prefiller.check()
        added: list[Request] = []
        try:
            for seq in group.seqs:    # all or nothing: QueueFullError leaves no trace
                self.scheduler.add_request(seq.request, remote=remote)
                added.append(seq.request)
        except BaseException:
            for r in added:
                self.scheduler.finish_request(r.request_id, RequestStatus.FINISHED_ABORTED)
            raise
        self.output_processor.add(group)
        if remote:
            try:
                self.prefiller.submit([s.request for s in group.seqs])
            except BaseException:
                self.abort(rid)
                raise

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks at once. Unknown ids are ignored."""
        group = self.output_processor.remove(request_id)
        if group is None:
            return
        for seq in group.seqs:
            rid = seq.request.request_id
            if not seq.request.is_finished:
                self.scheduler.finish_request(rid, RequestStatus.FINISHED_ABORTED)
            self.trace_requests.discard(rid)
            if self.prefiller is not None:
                self.prefiller.discard(rid)
            if self.spec is not None:
                self.spec.release(rid)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def _drain_inbox(self) -> None:
        for kind, item in self.inbox.drain():
            if kind == "abort":
                self.abort(item)
                continue
            try:
                self.admit(item)
            except Exception as e:     # refused (queue full, id in use, prefill worker gone): tell the caller
                if self.on_reject is None:
                    log.warning("request %s refused: %s", item.request_id, e)
                else:
                    self.on_reject(item.request_id, e)

    # ---- the step -------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        self._drain_inbox()
        self._before_schedule()
        sched = self.scheduler.schedule()
        with self.cpu_share.forward(self) if sched.scheduled else nullcontext():   # one engine's forward at a time
            ran = self.runner.execute(sched)
        if self.spec is not None and ran.hidden is not None:   # an MTP drafter reads the target's rows
            self.spec.observe_target(sched, ran.hidden)
        sampled = self._sample(ran)
        new_tokens = self._new_tokens(ran, sampled)
        finished = self.scheduler.update(sched, new_tokens)
        outputs = self.output_processor.process(ran.sample_request_ids, sampled)
        self.cpu_share.set_generating(self, self.has_unfinished_requests())
        self._after_step(sched, ran, new_tokens, finished, t0)     # its subscribers may run pooling slices
        return outputs

    def _before_schedule(self) -> None:
        if self.prefiller is not None:   # prompts whose KV is ready become schedulable; raises if the worker failed
            self.prefiller.poll(self.scheduler)
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, self.sampler)

    def _sample(self, ran: ModelRunnerOutput) -> StepSample | None:
        self._grammars = []
        if ran.logits is None:
            return None
        ids = ran.sample_request_ids
        reqs = [self.scheduler.requests[rid] for rid in ids]
        params = [r.sampling_params for r in reqs]
        cons = constraints_of(reqs) if any(p.structured is not None or p.thinking is not None for p in params) else []
        self._grammars = [(i, c) for i, c in enumerate(cons) if c is not None]   # advanced in _new_tokens
        trace = bool(self.trace_requests) and any(rid in self.trace_requests for rid in ids)
        if self.spec is not None and any(n > 1 for n in ran.num_rows):
            return self.spec.sample(ran.logits, ran.num_rows, reqs, [r.generator for r in reqs], self.sampler,
                                    trace=trace)
        meta = SamplingMetadata(
            params=params, generators=[r.generator for r in reqs],
            prompt_token_ids=[r.prompt_token_ids for r in reqs], output_token_ids=[r.output_token_ids for r in reqs],
            stop_token_ids=[r.eos_token_ids | frozenset(p.stop_token_ids or ()) for r, p in zip(reqs, params, strict=True)]
            if any(p.min_tokens for p in params) else [], constraints=cons)
        return StepSample.from_sampler(self.sampler(ran.logits, meta, trace=trace))

    def _new_tokens(self, ran: ModelRunnerOutput, sampled: StepSample | None) -> dict[str, list[int]]:
        if sampled is None:
            return {}
        if sampled.trace is not None:
            for rid, tr in zip(ran.sample_request_ids, sampled.trace, strict=True):
                if tr is not None and rid in self.trace_requests:
                    self.last_traces[rid] = tr
        if self.trace_requests and ran.logits is not None:
            for i, rid in enumerate(ran.sample_request_ids):
                if rid in self.trace_requests:
                    self.last_logits[rid] = ran.logits[sum(ran.num_rows[:i]) if ran.num_rows else i].clone()
        for i, grammar in self._grammars:   # structured outputs: the constrained requests' matchers only
            grammar.advance(sampled.token_ids[i])
        return dict(zip(ran.sample_request_ids, sampled.token_ids, strict=True))

    def _after_step(self, sched: SchedulerOutput, ran: ModelRunnerOutput, new_tokens: dict[str, list[int]],
                    finished: list[Request], t0: float) -> None:
        if self.spec is not None:
            for r in finished:
                self.spec.release(r.request_id)
            self.spec.observe(sched.num_batched_tokens, len(sched.scheduled), ran.num_rows,
                              time.perf_counter() - t0)   # the draft-length controller's step costs
        self.step_counter += 1 if sched.scheduled else 0
        self.scheduler.record_step(sched, time.perf_counter() - t0)
        kv_events, self._kv_events[:] = list(self._kv_events), []
        stopped, self._stopped[:] = list(self._stopped), []
        if self.events.active:
            done = [(r.request_id, r.finish_reason or "") for r in finished + stopped]
            self.events.publish(step_event(sched, ran.t_model, new_tokens, done, kv_events, t0, self.scheduler,
                                           self.kv_manager))
        self.publish_snapshot()

    def publish_snapshot(self, idle: bool = False) -> None:
        """Engine thread: replace the published snapshot (the block map only while someone reads it).
        ``idle``: only when a reader waits for a block map."""
        blocks = self.events.active or time.monotonic() < self._kv_view_until
        if idle and (not blocks or self._snapshot.kv_blocks is not None):
            return
        snap = take_snapshot(self.scheduler, self.kv_manager, self.step_counter, blocks)
        with self._published:
            self._snapshot = snap
            self._published.notify_all()

    def subscribe(self, fn: Callable[[EngineEvent], None]) -> Callable[[], None]:
        return self.events.subscribe(fn)


def _finisher(scheduler: Any, spec: Any, stopped: list[Request]) -> Callable[[str, RequestStatus], None]:
    def finish(request_id: str, status: RequestStatus) -> None:
        """End a running request (a stop string): its blocks are freed now."""
        req = scheduler.get_request(request_id)
        scheduler.finish_request(request_id, status)
        if req is not None:
            stopped.append(req)
        if spec is not None:
            spec.release(request_id)
    return finish


def _extras(spec: Any) -> Callable[[GroupState], dict[str, Any]]:
    def extras(g: GroupState) -> dict[str, Any]:
        """RequestOutput.extra: speculation stats, disaggregated prefill timings."""
        extra: dict[str, Any] = {}
        first = g.seqs[0].request
        if spec is not None:
            extra["spec_decode"] = spec_request_stats([s.request for s in g.seqs])
        if "disaggregated" in first.extra:
            extra["disaggregated"] = first.extra["disaggregated"]
        return extra
    return extras
