"""Work the server runs on the engine's own thread, between its steps: prompt scoring and embeddings.

A job is a generator: each ``next()`` does one bounded slice of work (one forward of at most a
step's worth of tokens) and the result is the generator's return value. ``EngineJobs`` runs one slice
per engine step, in arrival order, from an engine event subscriber: the engine calls its subscribers
on its own thread at the end of every step, so a slice never runs beside a step (no second thread in
the model, no lock) and a stream waits at most one slice between two of its steps.

While jobs are pending the subscriber stays registered and an idle loop is woken by queueing an abort
of ``WAKE_ID`` (no request has that id: aborting it does nothing), which makes the loop run a step
(empty when nothing else is running) and so reach the subscriber. With no job pending nothing is
subscribed and the engine runs exactly as without a server.

With an arbiter (``EngineJobs(engine, share)``, hitenter/engine/cpu_share.py) every slice holds its
``forward`` turn (no other engine of the process runs a forward meanwhile) and a ``paced`` job (embedding,
rerank) keeps to the pooling share while any engine generates: a slice the share does not admit yet is
put off to a later step; where this engine has no generation of its own, the engine thread first waits
out the delay (at most ``MAX_WAIT_S`` at a time, so a request arriving meanwhile waits no longer).
Without generation anywhere, slices run one per step as without an arbiter.

Contract: ``submit`` from the event loop; the future resolves there. A job that raises fails its
future only (the engine and other jobs go on). A cancelled future's job is dropped before its next
slice. ``close()`` fails every pending job.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from hitenter.engine.cpu_share import CpuShare

WAKE_ID = "\x00hitenter-engine-job-wake"     # never a request id (ids are printable)
MAX_WAIT_S = 0.05


class _Engine(Protocol):
    def subscribe(self, fn: Callable[[Any], None]) -> Callable[[], None]: ...
    def request_abort(self, request_id: str) -> None: ...


@dataclass
class _Job:
    work: Generator[Any, None, Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    paced: bool
    cancelled: threading.Event = field(default_factory=threading.Event)


class EngineJobs:
    def __init__(self, engine: _Engine, share: CpuShare | None = None) -> None:
        self._engine = engine
        self._share = share
        self._jobs: deque[_Job] = deque()
        self._lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = None
        self._closed = False

    def submit(self, work: Generator[Any, None, Any], paced: bool = False) -> asyncio.Future[Any]:
        """Queue ``work``; its result (or exception) arrives on the returned future. ``paced``: pooling
        work, kept to the arbiter's share beside generation."""
        loop = asyncio.get_running_loop()
        job = _Job(work, loop, loop.create_future(), paced)
        job.future.add_done_callback(lambda f: job.cancelled.set() if f.cancelled() else None)
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is shut down")
            self._jobs.append(job)
            if self._unsubscribe is None:
                self._unsubscribe = self._engine.subscribe(self._on_step)
        self._engine.request_abort(WAKE_ID)
        return job.future

    @property
    def pending(self) -> int:
        return len(self._jobs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            jobs, self._jobs = list(self._jobs), deque()
            self._stop_listening()
        for job in jobs:
            self._settle(job, exc=RuntimeError("the engine shut down before this work ran"))

    # ---- engine thread ---------------------------------------------------------------------------
    def _on_step(self, _event: Any) -> None:
        """One slice of the oldest live job (engine thread, at the end of a step)."""
        job = self._head()
        if job is None:
            return
        if job.paced and not self._admitted():
            self._engine.request_abort(WAKE_ID)     # ask again at the next step
            return
        try:
            self._slice(job)
        except StopIteration as done:
            self._finish(job, result=done.value)
        except Exception as e:       # the job's failure, never the engine's
            self._finish(job, exc=e)
        with self._lock:
            more = bool(self._jobs)
            if not more:
                self._stop_listening()
        if more:
            self._engine.request_abort(WAKE_ID)     # keep an otherwise idle loop stepping

    def _admitted(self) -> bool:
        """Whether the pooling share lets a slice run now (waiting first where this engine has nothing else)."""
        share = self._share
        if share is None or share.pooling_delay() <= 0:
            return True
        if share.generating(self._engine):
            return False
        share.sleep(min(share.pooling_delay(), MAX_WAIT_S))
        return share.pooling_delay() <= 0

    def _slice(self, job: _Job) -> None:
        """One ``next()`` of the job, under the arbiter's turn (and counted against the share when paced)."""
        if self._share is None:
            next(job.work)
        elif job.paced:
            with self._share.pooling_slice(self._engine) as rec:
                rec.done(next(job.work))
        else:
            with self._share.forward(self._engine):
                next(job.work)

    def _head(self) -> _Job | None:
        with self._lock:
            while self._jobs and self._jobs[0].cancelled.is_set():
                self._jobs.popleft().work.close()
            if not self._jobs:
                self._stop_listening()
                return None
            return self._jobs[0]

    def _finish(self, job: _Job, result: Any = None, exc: BaseException | None = None) -> None:
        with self._lock:
            if self._jobs and self._jobs[0] is job:
                self._jobs.popleft()
        self._settle(job, result, exc)

    def _stop_listening(self) -> None:     # lock held
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @staticmethod
    def _settle(job: _Job, result: Any = None, exc: BaseException | None = None) -> None:
        def settle() -> None:
            if job.future.done():
                return
            if exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
        try:
            job.loop.call_soon_threadsafe(settle)
        except RuntimeError:          # the caller's loop is closed: nobody is waiting
            pass
