"""AsyncLLMEngine: one engine loop in a background thread, each request an async stream of outputs.

The loop thread owns stepping; callers add and abort under the same lock, so validation errors
(ValueError, ContextOverflowError, QueueFullError) are raised to the caller synchronously, before
any stream starts. Torch releases the GIL inside kernels, so an asyncio server stays responsive.
A failure inside a step is delivered to every in-flight stream as an exception and those requests
are aborted (their KV blocks freed); the loop keeps serving new requests.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from hitenter.engine.llm_engine import LLMEngine
from hitenter.errors import QueueFullError
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams

log = logging.getLogger("hitenter.engine")


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
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._thread = threading.Thread(target=self._run, name="hitenter-engine", daemon=True)
        self._thread.start()

    # ---- public -----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                    loop: asyncio.AbstractEventLoop | None = None,
                    ) -> tuple[str, asyncio.Queue[RequestOutput | BaseException]]:
        """Queue a request; returns its id and the queue its outputs arrive on. Raises on bad input.

        Callable from a worker thread when ``loop`` (the loop that will read the queue) is given, so
        an event loop never blocks on the engine lock while a step runs."""
        loop = loop or asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        with self._lock:
            if self.max_queued_requests is not None and self.engine.scheduler.num_waiting >= self.max_queued_requests:
                raise QueueFullError(
                    f"the waiting queue is full ({self.engine.scheduler.num_waiting} requests waiting, "
                    f"max_queued_requests={self.max_queued_requests}); retry later")
            rid = self.engine.add_request(request_id, prompt, params)
            self._streams[rid] = _Stream(loop, q)
        self._wake.set()
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
        with self._lock:
            self.engine.abort(request_id)
            self._streams.pop(request_id, None)

    def run_locked(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        """Run fn with the engine lock held (for reads of engine state that must be consistent)."""
        with self._lock:
            return fn(*args, **kwargs)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            for rid in list(self._streams):
                self.engine.abort(rid)
            self._streams.clear()
        close = getattr(self.engine.runner, "close", None)   # tensor-parallel workers, if any
        if close is not None:
            close()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # ---- loop -------------------------------------------------------------------------------
    def _deliver(self, rid: str, item: RequestOutput | BaseException) -> None:
        st = self._streams.get(rid)
        if st is None:
            return
        if isinstance(item, BaseException) or item.finished:
            self._streams.pop(rid, None)
        try:
            st.loop.call_soon_threadsafe(st.queue.put_nowait, item)
        except RuntimeError:       # the caller's event loop is closed: nobody is listening
            self.engine.abort(rid)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                busy = self.engine.has_unfinished_requests()
                if busy:
                    try:
                        for out in self.engine.step():
                            self._deliver(out.request_id, out)
                    except Exception as e:   # a real internal error: fail the in-flight requests, keep serving
                        log.exception("engine step failed")
                        err = EngineDeadError(f"internal engine error: {type(e).__name__}: {e}")
                        for rid in list(self._streams):
                            self.engine.abort(rid)
                            self._deliver(rid, err)
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()
