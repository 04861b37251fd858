"""Embedding / rerank work stops when its client goes away: serving_embedding.pooled cancels the engine job
(EngineJobs drops it before its next slice) and the request ends with 499; a client that stays gets the
result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hitenter.server.api_error import APIError
from hitenter.server.engine_jobs import EngineJobs
from hitenter.server.serving_embedding import pooled


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


class _Request:
    """What until_disconnected reads: receive() answers http.disconnect once `gone` is set."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, str]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def _slices(ran: list[int], n: int) -> Any:
    for i in range(n):
        ran.append(i)
        yield
    return [[float(n)]]


def test_disconnect_drops_the_job_before_its_next_slice() -> None:
    async def run() -> None:
        eng, ran = _Engine(), []
        jobs = EngineJobs(eng)
        req = _Request()
        call = asyncio.ensure_future(pooled(req, jobs.submit(_slices(ran, 100))))  # type: ignore[arg-type]
        for _ in range(3):
            eng.step()
            await asyncio.sleep(0)
        req.gone.set()
        with pytest.raises(APIError) as e:
            await call
        assert e.value.status == 499
        for _ in range(10):
            eng.step()
        assert len(ran) <= 4 and jobs.pending == 0 and not eng.subs
    asyncio.run(run())


def test_a_client_that_stays_gets_the_result() -> None:
    async def run() -> None:
        eng, ran = _Engine(), []
        jobs = EngineJobs(eng)
        call = asyncio.ensure_future(pooled(_Request(), jobs.submit(_slices(ran, 5))))  # type: ignore[arg-type]
        while not call.done():
            eng.step()
            await asyncio.sleep(0)
        assert await call == [[5.0]] and len(ran) == 5
        assert await pooled(None, asyncio.sleep(0, [[1.0]])) == [[1.0]]   # no request: plain await
    asyncio.run(run())
