"""Side prefill: a long prompt that arrives while streams decode is prefilled in a thread of its own, on
half of the cores, while the engine loop keeps decoding the streams on the other half.

Why: on a CPU both a prompt and a batch of streams are compute bound, so sharing the cores' *time*
(prefill_pacing.py: chunks of the prompt beside the streams' rows, then decode-only steps that repay
the streams) hands out shares that sum to at most 1, less what small chunks waste, short of the goal
of at least half each at once. Sharing the *cores* does better because neither side scales perfectly
from 1 to 2 threads: on half the cores each side keeps more than half of its speed, so the shares sum to
more than 1, and the prompt runs in big chunks, not small ones. Chunks of CHUNK = 512 tokens, not the
engine's 2,048: the two sides share the L3 cache, and a 2,048-token chunk's activations (SmolLM2's MLP:
12.6 MB a tensor) crowd out the streams' weights. The measurements behind these choices are in
docs/benchmarks.md.

How (the in-process twin of disaggregated prefill, hitenter/distributed/disagg.py, same scheduler hooks):
- ``takes``: a prompt of at least ``min_tokens`` uncached tokens (and at most a quarter of it cached:
  the engine's own prefill reuses cached blocks, this lane does not), while the engine has generation
  rows to run. Otherwise the engine prefills it itself, paced beside the streams.
- ``submit``: the request parks as WAITING_FOR_REMOTE_KV (no blocks held); a worker thread computes the
  KV of the prompt but its last token into a scratch cache of its own (models/prompt_kv.py: the engine's
  row paths, so the KV is bitwise the engine's). The model's weights are shared, read-only; the worker
  touches neither the scheduler nor the block pool.
- Threads: every native kernel and torch op reads the process's torch thread count per call, so while
  a job runs that count is halved (both sides get half), and while the engine has nothing else to run
  the job gets them all. Results do not depend on the thread count (the kernels' row split is fixed).
- ``poll`` (engine thread, before each schedule): a finished job's requests join the waiting queue with
  the prompt but its last token counted as computed, like a prefix hit; the runner's ``load`` copies the
  staged KV into their blocks before the forward that computes the last prompt token and samples.
  A failed job logs a warning and its requests are prefilled by the engine instead: nothing is lost.
- ``discard`` (an abort): the staged KV is dropped; a job whose requests are all gone stops at its next
  chunk. ``close`` (also a finalizer) ends the worker thread.
Not used with tensor parallelism, disaggregated prefill, speculative decoding (the draft needs the
prompt too) or sliding-window block tables (Gemma 3's local layers hold fewer blocks): engine_setup.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from hitenter.engine.scheduler import Scheduler, SchedulerOutput
from hitenter.models.prompt_kv import load_staged, prefill_kv
from hitenter.request import Request, RequestStatus

log = logging.getLogger("hitenter.engine")

CHUNK = 512              # tokens per forward of a job (the module docstring says why not the engine's)
IDLE_POLL_S = 0.02       # an engine with nothing else to run waits this long for the job, not spinning


@dataclass
class _Job:
    requests: list[Request]            # the n sequences of one prompt share the job
    ids: torch.Tensor                  # the prompt but its last token
    kv: list[torch.Tensor] | None = None   # the scratch cache, one tensor per layer, once computed
    cancelled: bool = False
    done: bool = False
    error: str | None = None
    t_submit: float = field(default_factory=time.monotonic)
    t_done: float = 0.0

    @property
    def num_tokens(self) -> int:
        return self.ids.numel()


@dataclass(frozen=True)
class _Layout:
    """What the worker needs to compute a job: the model, the cache's per-layer row shape, the chunk."""
    model: Any
    shapes: tuple[tuple[int, int, int, int], ...]   # per layer: (2, kv_heads, block_size, row width)
    dtype: torch.dtype
    block_size: int
    chunk: int


def _work(layout: _Layout, jobs: queue.Queue[_Job | None], arrived: threading.Event) -> None:
    """The worker thread (no reference to the SidePrefill, so it can be garbage collected)."""
    while (job := jobs.get()) is not None:
        if not job.cancelled:
            try:
                nb = -(-job.num_tokens // layout.block_size)
                kv = [torch.zeros((a, h, nb, bs, w), dtype=layout.dtype) for a, h, bs, w in layout.shapes]
                if prefill_kv(layout.model, job.ids, kv, layout.block_size, layout.chunk, lambda: job.cancelled):
                    job.kv = kv
            except Exception as e:   # reported by poll; the engine prefills the request itself
                job.error = f"{type(e).__name__}: {e}"
        job.t_done = time.monotonic()
        job.done = True
        arrived.set()


class SidePrefill:
    """Long prompts beside decoding streams, prefilled on half of the cores (see the module docstring)."""

    def __init__(self, model: Any, kv_caches: list[torch.Tensor], block_size: int, chunk: int,
                 min_tokens: int, threads: int) -> None:
        """``kv_caches``: the engine's (one block count for every layer); ``chunk``: tokens per forward;
        ``min_tokens``: the fewest uncached prompt tokens taken; ``threads``: the engine's thread count."""
        if len({c.shape[2] for c in kv_caches}) != 1:
            raise ValueError("side prefill needs one block table for every layer")
        self.layout = _Layout(model, tuple((c.shape[0], c.shape[1], c.shape[3], c.shape[4]) for c in kv_caches),
                              kv_caches[0].dtype, block_size, chunk)
        self.min_tokens = min_tokens
        self.threads = threads
        self.jobs: deque[_Job] = deque()   # submitted, in order; the worker runs them one at a time
        self.staged: dict[str, tuple[list[torch.Tensor], int]] = {}   # computed, not admitted yet
        self.num_jobs = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._arrived = threading.Event()
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None   # once the thread runs

    # ---- the engine's hooks (engine thread) ----------------------------------------------------------
    def takes(self, request: Request, scheduler: Scheduler) -> bool:
        """Whether ``request`` (just arrived) is prefilled here rather than by the engine's steps."""
        n = request.num_prompt_tokens
        if n - 1 < self.min_tokens or not scheduler.decoding:
            return False
        _, cached = scheduler.kv.get_computed_blocks(request)
        return n - cached >= self.min_tokens and cached <= (n - cached) // 4

    def check(self) -> None:
        """Nothing to raise: a failed job falls back to the engine's own prefill."""

    def submit(self, requests: list[Request]) -> None:
        """Prefill the prompt of ``requests`` (sequences of one prompt, parked as WAITING_FOR_REMOTE_KV)."""
        if self._thread is None:
            self._thread = threading.Thread(target=_work, args=(self.layout, self._queue, self._arrived),
                                            name="hitenter-side-prefill", daemon=True)
            self._thread.start()
            self._finalizer = weakref.finalize(self, _stop, self._queue, self.jobs, self._thread)
        job = _Job(list(requests), torch.tensor(requests[0].prompt_token_ids[:-1], dtype=torch.long))
        self.jobs.append(job)
        self.num_jobs += 1
        self._set_threads(self._half)
        self._queue.put(job)

    def poll(self, scheduler: Scheduler) -> None:
        """Queue the requests whose KV is computed; give the job every thread while nothing else runs."""
        self._arrived.clear()
        busy = bool(scheduler.running or scheduler.waiting)
        if self.jobs and not self.jobs[0].done and not busy:
            self._set_threads(self.threads)
            self._arrived.wait(IDLE_POLL_S)
        while self.jobs and self.jobs[0].done:
            self._finish(self.jobs.popleft(), scheduler)
        self._set_threads(self._half if self.jobs and busy else self.threads)

    def discard(self, request_id: str) -> None:
        """An aborted request: drop its staged KV; a job none of whose requests is left stops early."""
        self.staged.pop(request_id, None)
        for job in self.jobs:
            if all(r.is_finished for r in job.requests):
                job.cancelled = True

    def load(self, out: SchedulerOutput, kv_caches: list[torch.Tensor]) -> None:
        """Copy the staged KV of the requests admitted in this step into their first blocks (runner)."""
        load_staged(self.staged, out.scheduled, kv_caches)

    def close(self) -> None:
        """End the worker thread (idempotent); restores the engine's thread count."""
        if self._finalizer is not None:
            self._finalizer()
        self._set_threads(self.threads)

    # ---- internals -------------------------------------------------------------------------------------
    @property
    def _half(self) -> int:
        return max(1, self.threads // 2)

    def _set_threads(self, n: int) -> None:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

    def _finish(self, job: _Job, scheduler: Scheduler) -> None:
        if job.error is not None:
            log.warning("side prefill failed (%s); the engine prefills the prompt itself", job.error)
        for req in job.requests:
            rid = req.request_id
            if scheduler.get_request(rid) is not req or req.status is not RequestStatus.WAITING_FOR_REMOTE_KV:
                continue          # aborted meanwhile (its id may have been reused since)
            if job.kv is None:    # failed: queued with nothing computed, like any new request
                scheduler.remote_kv_ready(rid, 0)
                continue
            req.extra["side_prefill"] = {"prefill_tokens": job.num_tokens, "side_s": job.t_done - job.t_submit}
            self.staged[rid] = (job.kv, job.num_tokens)
            scheduler.remote_kv_ready(rid, job.num_tokens)


def _stop(work: queue.Queue[_Job | None], jobs: deque[_Job], thread: threading.Thread) -> None:
    for job in jobs:          # a job in flight stops at its next chunk
        job.cancelled = True
    work.put(None)
    if thread is not threading.current_thread():
        thread.join(timeout=5)
