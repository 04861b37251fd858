"""EngineJobs under the process's arbiter (hitenter/engine/cpu_share.py): a paced job (embedding, rerank) on
one engine keeps to the pooling share while another engine generates, counted in slices admitted per
generation step on a fake clock; it still finishes, with the same result; without generation it runs one
slice per step; an engine that generates itself never waits inside its own step."""

from __future__ import annotations

import asyncio
from typing import Any

from hitenter.engine.cpu_share import CpuShare
from hitenter.server.engine_jobs import EngineJobs

STEP_S = 0.05       # one generation step of the chat engine
SLICE_S = 0.05      # one pooling slice


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept = 0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept += 1
        self.t += s


class _Engine:
    def __init__(self) -> None:
        self.subs: list[Any] = []

    def subscribe(self, fn: Any) -> Any:
        self.subs.append(fn)
        return lambda: self.subs.remove(fn)

    def request_abort(self, rid: str) -> None:
        pass

    def step(self) -> None:
        for fn in list(self.subs):
            fn(None)


def _slices(clock: Clock, n: int, ran: list[float]) -> Any:
    for _ in range(n):
        clock.t += SLICE_S
        ran.append(clock.t)
        yield 64
    return [[float(i) for i in range(n)]]


def _setup() -> tuple[Clock, CpuShare, _Engine, _Engine, EngineJobs]:
    clock = Clock()
    share = CpuShare(0.2, window_s=1.0, clock=clock, sleep=clock.sleep)
    chat, rerank = _Engine(), _Engine()
    return clock, share, chat, rerank, EngineJobs(rerank, share)


def test_rerank_beside_generation_keeps_to_the_share_and_finishes_unchanged() -> None:
    async def run() -> None:
        clock, share, chat, rerank, jobs = _setup()
        ran: list[float] = []
        fut = jobs.submit(_slices(clock, 40, ran), paced=True)
        share.set_generating(chat, True)
        steps = 0
        while not fut.done() and steps < 10_000:
            clock.t += STEP_S                # the chat engine's step, then the rerank engine's
            steps += 1
            rerank.step()
            await asyncio.sleep(0)
        # 40 slices of 50 ms at 20 % of the wall time: about 10 s of generation, never more than 4 a second
        assert len(ran) == 40
        assert all(sum(1 for t in ran if end - 1.0 < t <= end) <= 4 for end in ran)
        assert clock.t >= 40 * SLICE_S / 0.2 - 1.0 and steps < 10_000
        assert await fut == [[float(i) for i in range(40)]]
    asyncio.run(run())


def test_without_generation_every_step_runs_a_slice() -> None:
    async def run() -> None:
        clock, share, _chat, rerank, jobs = _setup()
        ran: list[float] = []
        fut = jobs.submit(_slices(clock, 10, ran), paced=True)
        for _ in range(11):                  # the 11th finds the job done
            rerank.step()
        assert len(ran) == 10 and clock.slept == 0
        await asyncio.sleep(0)
        assert fut.done() and len(await fut) == 1
    asyncio.run(run())


def test_an_engine_that_generates_itself_puts_pooling_off_without_waiting() -> None:
    async def run() -> None:
        clock, share, _chat, rerank, jobs = _setup()
        ran: list[float] = []
        jobs.submit(_slices(clock, 20, ran), paced=True)
        share.set_generating(rerank, True)   # this engine has streams of its own: its step must not wait
        for _ in range(40):
            clock.t += STEP_S
            rerank.step()
        assert clock.slept == 0 and 0 < len(ran) < 20
    asyncio.run(run())


def test_unpaced_jobs_are_not_held_to_the_share() -> None:
    async def run() -> None:
        clock, share, chat, rerank, jobs = _setup()
        ran: list[float] = []
        jobs.submit(_slices(clock, 10, ran))     # prompt scoring for a chat request: not pooling
        share.set_generating(chat, True)
        for _ in range(10):
            rerank.step()
        assert len(ran) == 10 and clock.slept == 0
    asyncio.run(run())
