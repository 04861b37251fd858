"""Scheduler: one rule for prefill, chunked prefill, prefix hits and decode.

Each step every request is given ``min(num_tokens - num_computed_tokens, token budget left)`` new
tokens: running requests first (oldest first), then waiting ones in FCFS order, within
``max_num_batched_tokens`` tokens and ``max_num_seqs`` running requests. A fresh prompt is far
behind, a decode is one behind, a prefix hit advances ``num_computed_tokens`` when the request is
first admitted, and a long prompt that does not catch up in one step is a chunked prefill.

Contracts:
- ``ScheduledRequest.num_computed_tokens`` is the request's value at schedule time (after a prefix
  hit); the step computes tokens ``[num_computed_tokens, num_computed_tokens + num_new_tokens)``.
  It is *caught up* when that range ends at ``request.num_tokens``: only those get a sampled token.
- When a running request's blocks do not fit, the newest running request is preempted (blocks
  freed, status PREEMPTED, num_computed_tokens = 0, outputs kept, put at the FRONT of waiting) and
  allocation is retried; if the request itself is the newest, it is preempted and the running pass
  stops. No waiting request is admitted in a step that preempted.
- A waiting request that does not fit stays at the head of the queue: no one jumps ahead (FCFS).
- ``add_request`` rejects a request that could never fit the KV cache alone (ContextOverflowError),
  so the queue cannot deadlock.
- ``update`` advances num_computed_tokens, appends sampled tokens (caught-up requests only), decides
  token stops (EOS, stop token ids, max_tokens: hitenter/engine/stopping.py) and caches newly full
  verified blocks. A stop frees the request's blocks at once, like ``finish_request`` (aborts, and the
  output processor's stop strings).
- Drafted tokens (``request.spec_token_ids``) must be scored in one pass: the drafts that do not fit
  the token budget are dropped, and drafts are dropped before anyone is preempted for blocks.
  ``update`` takes the ``1 + accepted`` tokens of a speculating request, rolls
  ``num_computed_tokens`` back over the rejected drafts and releases the blocks they needed.
- Disaggregated prefill: ``add_request(req, remote=True)`` parks a request as WAITING_FOR_REMOTE_KV
  (not schedulable, holds no blocks); ``remote_kv_ready(id, n)`` queues it once the KV of its first
  ``n`` tokens has arrived, and its admission counts those ``n`` as computed (allocating their blocks;
  the runner copies the KV in), like a prefix hit.
- Fresh lane (hitenter/engine/fresh_lane.py): a step may run only the requests with fewer than
  ``fresh_tokens`` outputs (``SchedulerOutput.lane_only``), skipping the older running ones; the
  engine reports each step's time through ``record_step``, which bounds those steps.
- Prefill pacing (hitenter/engine/prefill_pacing.py): beside decoding streams a step takes at most the
  pacer's chunk of prompt tokens, and none while the streams are owed time (``PrefillPacer.budget``).
  Only established streams (``max(fresh_tokens, 1)`` outputs or more) are paced for: while every running
  request is still within its first tokens (a burst of arrivals behind its first prompt), prompts take the
  full budget, as the fresh lane puts first tokens first, and such a step owes the pacer nothing.
- Images (``Request.images``): a step never cuts an image's rows (hitenter/request.py ImageRun), and an image
  not yet encoded also costs its rows' count against the token budget (the encoder's work, done in that
  step by the runner: hitenter/engine/encoder_cache.py), see ``_image_step``.
- ``SchedulerOutput.kv_events`` holds every KV event since the previous ``schedule()`` returned
  (the previous step's cache/free events, then this call's), so each event appears exactly once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hitenter.config import SchedulerConfig
from hitenter.engine.fresh_lane import FreshLane
from hitenter.engine.prefill_pacing import PrefillPacer
from hitenter.engine.stopping import append_until_stop
from hitenter.errors import ContextOverflowError, QueueFullError
from hitenter.kv_cache.events import KVEvent
from hitenter.kv_cache.manager import KVCacheManager
from hitenter.kv_cache.state_group import StateStep
from hitenter.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int          # tokens to compute this step, starting at num_computed_tokens
    num_computed_tokens: int     # request.num_computed_tokens at schedule time (after any prefix hit)
    block_ids: list[int]         # the request's whole block table after allocation
    local_block_ids: list[int] | None = None   # the sliding-window layers' table (kv_cache/window_group.py)
    state: StateStep | None = None   # the recurrent layers' slot, restore and saves (kv_cache/state_group.py)

    @property
    def caught_up(self) -> bool:
        """True when this step computes up to the request's last token (valid until update())."""
        return self.num_computed_tokens + self.num_new_tokens >= self.request.num_tokens


@dataclass
class SchedulerOutput:
    step_id: int
    scheduled: list[ScheduledRequest]   # batch order
    preempted: list[Request]
    num_batched_tokens: int
    kv_events: list[KVEvent] = field(default_factory=list)
    lane_only: bool = False             # only fresh requests ran (fresh_lane.py)


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_steps: int
    num_preemptions: int
    kv_usage: float
    num_free_blocks: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_rate: float


class Scheduler:
    """Owns the waiting queue and the running list; talks to the KV cache only via KVCacheManager."""

    def __init__(self, scheduler_config: SchedulerConfig, kv_manager: KVCacheManager) -> None:
        self.config = scheduler_config
        self.kv = kv_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []        # oldest first
        self.requests: dict[str, Request] = {}  # live (unfinished) requests
        self.remote: dict[str, Request] = {}    # waiting for remote KV (disaggregated prefill)
        self._remote_tokens: dict[str, int] = {}   # queued, with this many tokens' KV arrived
        self._step_id = 0
        self._num_preemptions = 0
        self._events: list[KVEvent] = []
        kv_manager.subscribe(self._events.append)
        self.pacer = PrefillPacer()
        self._paced = False   # whether the last step picked was paced (it had established streams)
        # whether the vision encoder's rows of an image key are cached (engine_setup: the EncoderCache); None:
        # every image in a step counts its encoder's cost
        self.encoded: Callable[[bytes], bool] | None = None
        self.lane = FreshLane(scheduler_config.fresh_tokens, pacer=self.pacer)

    # ---- queue ------------------------------------------------------------------------------------------
    def add_request(self, request: Request, remote: bool = False) -> None:
        """Queue a request (status WAITING; WAITING_FOR_REMOTE_KV when ``remote``).
        Raises QueueFullError, ContextOverflowError, ValueError."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already scheduled")
        limit = self.config.max_queued_requests
        if limit is not None and self.num_waiting >= limit:
            raise QueueFullError(f"the waiting queue is full ({limit} requests); retry later")
        n_ctx = min(self.config.max_model_len, self.kv.max_context_tokens(self.config.max_num_batched_tokens))
        if request.num_prompt_tokens + request.max_tokens > n_ctx:
            raise ContextOverflowError(request.num_prompt_tokens, n_ctx, request.max_tokens)
        request.status = RequestStatus.WAITING_FOR_REMOTE_KV if remote else RequestStatus.WAITING
        self.requests[request.request_id] = request
        if remote:
            self.remote[request.request_id] = request
        else:
            self.waiting.append(request)

    def remote_kv_ready(self, request_id: str, num_tokens: int) -> None:
        """The KV of the request's first ``num_tokens`` tokens arrived: queue it (FCFS from now)."""
        req = self.remote.pop(request_id)
        req.status = RequestStatus.WAITING
        self._remote_tokens[request_id] = num_tokens
        self.waiting.append(req)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.remote)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def decoding(self) -> bool:
        """Whether a running request is past its prompt (its next rows are generation rows)."""
        return any(not _prefilling(r, r.num_computed_tokens) for r in self.running)

    @property
    def streaming(self) -> bool:
        """Whether a running request is an established stream: past its prompt with ``max(fresh_tokens, 1)``
        outputs or more (the streams prompt tokens are paced beside)."""
        least = max(self.config.fresh_tokens, 1)
        return any(not _prefilling(r, r.num_computed_tokens) and r.num_output_tokens >= least for r in self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.remote)

    @property
    def stats(self) -> SchedulerStats:
        pc = self.kv.prefix_cache_stats
        return SchedulerStats(len(self.running), self.num_waiting, self._step_id, self._num_preemptions,
                              self.kv.usage, self.kv.num_free_blocks, pc.queries, pc.hits, pc.hit_rate)

    # ---- the step -----------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch under the one rule (see module docstring)."""
        lane = self.lane.lane_only(self.running, self.waiting)
        scheduled, preempted, budget = self._pick(lane)
        if lane and not scheduled:      # the fresh head of the queue did not fit: a full step
            lane, (scheduled, preempted, budget) = False, self._pick(False)
        self._step_id += 1
        events, self._events[:] = list(self._events), []
        return SchedulerOutput(self._step_id, scheduled, preempted,
                               self.config.max_num_batched_tokens - budget, events, lane)

    def record_step(self, out: SchedulerOutput, seconds: float) -> None:
        """The step of ``out`` ran for ``seconds`` (bounds the fresh lane's steps and paces long prompts)."""
        prompt = sum(sr.num_new_tokens for sr in out.scheduled if _prefilling(sr.request, sr.num_computed_tokens))
        decoding = self._paced and any(not _prefilling(sr.request, sr.num_computed_tokens) for sr in out.scheduled)
        self.lane.record(out.lane_only, seconds)
        self.pacer.record(out.lane_only, seconds, prompt, decoding)

    def _pick(self, lane: bool) -> tuple[list[ScheduledRequest], list[Request], int]:
        """(scheduled, preempted, budget left); with ``lane`` the older running requests sit it out."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        # prompt tokens beside established streams: paced (prefill_pacing.py)
        paced = self._paced = self.streaming
        prompt_budget = self.pacer.budget(lane) if paced else budget
        prompt_taken = False   # a prompt's rows are in the step already (an image may overrun only the first)

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            prefill = _prefilling(req, req.num_computed_tokens)
            room = min(budget, prompt_budget) if prefill else budget
            n = min(req.num_tokens - req.num_computed_tokens, room)
            cost = n
            if req.images and prefill:   # whole images only, and their encoder's cost
                n, cost = self._image_step(req, req.num_computed_tokens, n, room, prompt_taken)
            if n <= 0 or (lane and not self.lane.is_fresh(req)):
                i += 1
                continue
            if req.spec_token_ids:   # drafts are verified in one pass: drop those past the budget
                _drop_drafts(req, req.num_tokens - req.num_computed_tokens - n)
            while self.kv.allocate_slots(req, n) is None:
                if req.spec_token_ids:   # drop the drafts before preempting anyone
                    _drop_drafts(req, len(req.spec_token_ids))
                    n = min(n, req.num_tokens - req.num_computed_tokens)
                    continue
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req.status is RequestStatus.PREEMPTED:
                break   # it was the newest: everything after it is preempted too
            scheduled.append(self._scheduled(req, n))
            budget -= cost
            prompt_budget -= cost if prefill else 0
            prompt_taken |= prefill
            i += 1

        while (not preempted and self.waiting and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            hits, num_hit = self.kv.get_computed_blocks(req)
            remote = self._remote_tokens.get(req.request_id, 0)
            if remote:    # disaggregated prefill: blocks for the arrived KV, filled by the runner
                hits, num_hit = [], remote
            room = min(budget, prompt_budget)
            n = cost = min(req.num_tokens - num_hit, room)
            if req.images:
                n, cost = self._image_step(req, num_hit, n, room, prompt_taken)
            if n <= 0 or self.kv.allocate_slots(req, n + remote, hits) is None:
                break   # stays at the head: FCFS, no bypass
            self.waiting.popleft()
            self._remote_tokens.pop(req.request_id, None)
            first = req.metrics.first_scheduled_time is None
            if first:
                req.metrics.first_scheduled_time = time.monotonic()
                req.num_cached_tokens = min(len(hits) * self.kv.block_size, req.num_prompt_tokens)
            req.num_computed_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(self._scheduled(req, n))
            budget -= cost
            prompt_budget -= cost
            prompt_taken = True
        return scheduled, preempted, budget

    def _image_step(self, req: Request, start: int, n: int, room: int, prompt_taken: bool) -> tuple[int, int]:
        """(new tokens, their cost) for a prompt holding images, from ``start``, at most ``n`` tokens: the step
        ends before an image it would cut, an image the encoder has not run yet costs its rows again (its
        encoder cost, against the token budget), images that do not fit ``room`` wait. An image at
        ``start`` that cannot fit is taken whole, over budget, when no other prompt rows are in the step and
        ``room`` > 0 (so an image longer than the budget still runs)."""
        end = max(start, req.image_floor(start + n))
        while True:
            inside = [im for im in req.images if start <= im.start < end]
            cost = end - start + sum(im.length for im in inside if not self._encoded(im.key))
            if cost <= room or not inside:
                break
            end = inside[-1].start
        if end > start:
            return end - start, cost
        first = next((im for im in req.images if im.start == start), None)
        if first is None or prompt_taken or room <= 0:
            return 0, 0
        return first.length, first.length * (1 if self._encoded(first.key) else 2)

    def _encoded(self, key: bytes) -> bool:
        return self.encoded is not None and self.encoded(key)

    def _scheduled(self, req: Request, n: int) -> ScheduledRequest:
        """The step's entry for ``n`` new tokens of ``req`` (allocated; num_computed_tokens set)."""
        rid = req.request_id
        return ScheduledRequest(req, n, req.num_computed_tokens, self.kv.block_table(rid),
                                self.kv.local_block_table(rid), self.kv.state_step(req, n))

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.spec_token_ids.clear()
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.metrics.num_preemptions += 1
        self._num_preemptions += 1
        self.waiting.appendleft(req)

    def update(self, out: SchedulerOutput, sampled: Mapping[str, Sequence[int]]) -> list[Request]:
        """Apply a step's results: computed tokens, sampled tokens, token stops, newly full verified blocks.

        Each sampled token is appended and checked in order (``check_token_stop``: EOS, stop ids,
        max_tokens); a stop ends the request there (later tokens of a speculative run are dropped) and
        frees its blocks. Returns the requests finished here. Requests finished (e.g. aborted) since
        ``schedule()`` are skipped. A token for a request that did not catch up is a caller bug (ValueError).
        """
        finished: list[Request] = []
        for sr in out.scheduled:
            req = sr.request
            if req.status is not RequestStatus.RUNNING or self.requests.get(req.request_id) is not req:
                continue
            tokens = sampled.get(req.request_id, ())
            if tokens and not sr.caught_up:
                raise ValueError(f"request {req.request_id!r} got a token but did not catch up")
            if len(tokens) > len(req.spec_token_ids) + 1:
                raise ValueError(f"request {req.request_id!r} got more tokens than its drafts + 1")
            rejected = len(req.spec_token_ids) + 1 - len(tokens) if tokens else 0
            req.num_computed_tokens = sr.num_computed_tokens + sr.num_new_tokens - rejected
            req.spec_token_ids.clear()
            stop = append_until_stop(req, tokens)
            if rejected:
                self.kv.trim(req, req.num_tokens)
            self.kv.cache_blocks(req, min(req.num_computed_tokens, req.num_tokens))
            if stop is not None:
                req.stop_reason = stop[1]
                self.finish_request(req.request_id, RequestStatus.FINISHED_LENGTH if stop[0] == "length"
                                    else RequestStatus.FINISHED_STOPPED)
                finished.append(req)
        return finished

    def finish_request(self, request_id: str, status: RequestStatus) -> None:
        """Finish (stop / length / abort) a waiting or running request and free its blocks now.

        Unknown or already finished ids are ignored.
        """
        if not status.finished:
            raise ValueError(f"status: {status} is not a finished status")
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        self._remote_tokens.pop(request_id, None)
        if req in self.running:
            self.running.remove(req)
        elif self.remote.pop(request_id, None) is None:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.kv.free(req)
        req.status = status
        if req.metrics.finished_time is None:
            req.metrics.finished_time = time.monotonic()


def _drop_drafts(req: Request, num: int) -> None:
    """Drop the last ``num`` drafted tokens (at most all of them)."""
    num = min(num, len(req.spec_token_ids))
    if num > 0:
        del req.spec_token_ids[len(req.spec_token_ids) - num:]


def _prefilling(req: Request, num_computed: int) -> bool:
    """Whether a request's next rows are prompt rows (a new or preempted request still computing its prompt)."""
    return num_computed < req.num_prompt_tokens
