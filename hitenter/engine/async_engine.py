"""AsyncLLMEngine: one engine loop in a background thread, each request an async stream of outputs.

No lock is shared with the loop (vLLM v1's engine-core busy loop is the model): the loop thread owns
the engine. Other threads
- add: ``add_request`` validates and tokenizes in the caller's thread (ValueError, ContextOverflowError,
  QueueFullError are raised there, before any stream starts), then puts the request in the engine's
  inbox; the loop admits it at the top of its next step (a refusal then, e.g. an id in use, arrives on
  the stream as the exception);
- abort: ``abort`` queues it; the loop applies it, freeing the blocks, at the top of its next step;
- read state: ``snapshot()`` is the ``EngineSnapshot`` published after every step (queue lengths, KV
  usage, prefix-cache hit rate, scheduler stats; with ``snapshot(kv_blocks=True)`` the KV block map
  too, see hitenter/engine/snapshot.py). ``run_on_snapshot(fn, *args)`` runs ``fn`` at once in the
  caller's thread (no lock), with the engine argument replaced by a ``SnapshotView`` of the latest
  snapshot (the engine's attribute names over published values).
None of these waits on a step. (One exception, bounded: the first block-map read after a quiet spell
of KV_VIEW_TTL_S waits for the next publication, at most the end of the running step; while the
playground's event stream is subscribed the map is published after every step.) A failure inside a step is delivered to every in-flight stream as an
exception and those requests are aborted (their KV blocks freed); the loop keeps serving new requests.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hitenter.engine.llm_engine import LLMEngine
from hitenter.engine.snapshot import EngineSnapshot, SnapshotView
from hitenter.errors import QueueFullError
from hitenter.kernels.arena import trim_heap
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams

log = logging.getLogger("hitenter.engine")
T = TypeVar("T")

IDLE_WAIT_S = 0.05
TRIM_AFTER_IDLE_S = 1.0   # not after every request: the next one would fault the pages back in


class EngineDeadError(RuntimeError):
    """The engine loop failed while this request was in flight."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, max_queued_requests: int | None = None) -> None:
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()     # guards _streams only; never held across a step
        self._stop = threading.Event()
        engine.on_reject = self._reject
        self._thread = threading.Thread(target=self._run, name="hitenter-engine", daemon=True)
        self._thread.start()

    # ---- public -----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                    loop: asyncio.AbstractEventLoop | None = None,
                    ) -> tuple[str, asyncio.Queue[RequestOutput | BaseException]]:
        """Queue a request; returns its id and the queue its outputs arrive on. Raises on bad input.

        Never waits on a step. Callable from a worker thread when ``loop`` (the loop that will read the
        queue) is given."""
        loop = loop or asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        eng = self.engine
        pending = eng.prepare_request(request_id, prompt, params)
        rid = pending.request_id
        with self._streams_lock:
            waiting = eng.snapshot().num_waiting + eng.inbox.num_adds
            if self.max_queued_requests is not None and waiting >= self.max_queued_requests:
                raise QueueFullError(
                    f"the waiting queue is full ({waiting} requests waiting, "
                    f"max_queued_requests={self.max_queued_requests}); retry later")
            if rid in self._streams:
                raise ValueError(f"request_id: {rid!r} is already in use")
            self._streams[rid] = _Stream(loop, q)
        eng.submit(pending)
        return rid, q

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield outputs until the request finishes. Leaving early (a client that went away) aborts it."""
        rid, q = self.add_request(prompt, params, request_id)
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        """Queue the abort (applied at the top of the next step); never waits on a step."""
        with self._streams_lock:
            self._streams.pop(request_id, None)
        self.engine.request_abort(request_id)

    def snapshot(self, kv_blocks: bool = False) -> EngineSnapshot:
        """The engine state published after the last step (see the module docstring)."""
        return self.engine.snapshot(kv_blocks)

    def run_on_snapshot(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args)`` now, in the caller's thread and without a lock; an engine argument becomes a
        SnapshotView of the latest snapshot."""
        if any(a is self.engine for a in args):
            view = SnapshotView(self.engine, self.engine.snapshot(kv_blocks=True))
            args = tuple(view if a is self.engine else a for a in args)
        return fn(*args, **kwargs)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.engine.on_reject = None
        self.engine.inbox.wake.set()
        self._thread.join(timeout)
        with self._streams_lock:
            rids = list(self._streams)
            self._streams.clear()
        for rid in rids:     # the loop has stopped (else it applies them)
            (self.engine.request_abort if self._thread.is_alive() else self.engine.abort)(rid)
        close = getattr(self.engine.runner, "close", None)   # tensor-parallel workers, if any
        if close is not None:
            close()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # ---- loop (engine thread) -------------------------------------------------------------------
    def _deliver(self, rid: str, item: RequestOutput | BaseException) -> None:
        with self._streams_lock:
            st = self._streams.get(rid)
            if st is not None and (isinstance(item, BaseException) or item.finished):
                self._streams.pop(rid, None)
        if st is None:
            return
        try:
            st.loop.call_soon_threadsafe(st.queue.put_nowait, item)
        except RuntimeError:       # the caller's event loop is closed: nobody is listening
            self.engine.abort(rid)

    def _reject(self, rid: str, exc: BaseException) -> None:
        self._deliver(rid, exc)

    def _run(self) -> None:
        eng = self.engine
        # when the last step ended (at first: when the engine started, so start-up's freed heap goes too),
        # until the heap is trimmed
        busy_until: float | None = time.monotonic()
        while not self._stop.is_set():
            eng.inbox.wake.clear()
            if eng.inbox or eng.has_unfinished_requests():
                self._step()
                busy_until = time.monotonic()
                continue
            if busy_until is not None and time.monotonic() - busy_until >= TRIM_AFTER_IDLE_S:
                trim_heap()   # idle for a while: hand the steps' freed heap back to the OS (arena.keep_heap)
                busy_until = None
            eng.publish_snapshot(idle=True)
            eng.inbox.wake.wait(IDLE_WAIT_S)

    def _step(self) -> None:
        eng = self.engine
        try:
            for out in eng.step():
                self._deliver(out.request_id, out)
        except Exception as e:   # a real internal error: fail the in-flight requests, keep serving
            log.exception("engine step failed")
            err = EngineDeadError(f"internal engine error: {type(e).__name__}: {e}")
            with self._streams_lock:
                rids = list(self._streams)
            for rid in rids:
                eng.abort(rid)
                self._deliver(rid, err)
