"""The engine streams of one HTTP request, and the client's disconnect.

``RequestStreams.outputs`` reads the queues that ``EngineClient.add`` returned and yields
``(prompt_index, RequestOutput)`` as they arrive. However it ends (done, an engine error raised to the
caller, or the consumer closed/cancelled because the client went away), every engine request of it
that has not finished is aborted, which frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request

from hitenter.outputs import RequestOutput
from hitenter.server.engine_client import Handle

T = TypeVar("T")
Source = AsyncIterator[tuple[int, RequestOutput]]


class RequestStreams:
    """The engine requests of one HTTP request. ``outputs()`` merges their queues; ``close()`` aborts
    every one not finished yet (idempotent), and runs whenever ``outputs()`` ends, or from the
    response's own ``finally`` when the client left before ``outputs()`` ever started."""

    def __init__(self, handles: list[Handle], abort: Callable[[str], None],
                 on_abort: Callable[[], None] | None = None) -> None:
        self.handles, self.abort, self.on_abort = handles, abort, on_abort
        self.live = set(range(len(handles)))

    def close(self) -> None:
        for i in sorted(self.live):
            self.abort(self.handles[i][0])
            if self.on_abort is not None:
                self.on_abort()
        self.live.clear()

    async def outputs(self) -> Source:
        live, handles = self.live, self.handles
        pending: dict[asyncio.Future[Any], int] = {}
        try:
            while live:
                if len(live) == 1 and not pending:        # the common case: no helper tasks
                    i = next(iter(live))
                    ready = [(i, await handles[i][1].get())]
                else:
                    for i in live - set(pending.values()):
                        pending[asyncio.ensure_future(handles[i][1].get())] = i
                    done, _ = await asyncio.wait(list(pending), return_when=asyncio.FIRST_COMPLETED)
                    ready = sorted(((pending.pop(t), t.result()) for t in done), key=lambda x: x[0])
                for i, item in ready:
                    if isinstance(item, BaseException):
                        raise item
                    if item.finished:
                        live.discard(i)
                    yield i, item
        finally:
            for t in pending:
                t.cancel()
            self.close()


async def wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run work; if the client goes away first, cancel it (its streams abort their requests) -> None."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return None
    finally:
        watch.cancel()
