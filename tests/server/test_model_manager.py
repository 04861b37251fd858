"""ModelManager (hitenter/server/model_manager.py) on scripted engine clients: loads on first use, leases
held until release, keep-alive expiry, least-recently-used eviction under the model-count and memory
limits, waiting for models in use and refusing what cannot fit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hitenter.server.api_error import APIError
from hitenter.server.engine_client import ModelInfo
from hitenter.server.lifecycle import Lifecycle
from hitenter.server.model_catalog import Catalog
from hitenter.server.model_manager import _LEASES, DEFAULT, ModelManager, Resident, UnknownModel
from hitenter.server.served_model import ServedModel

MB = 1 << 20


class ScriptedClient:
    """An EngineClient that only knows its size and whether it was shut down."""

    def __init__(self, size: int) -> None:
        self.info = ModelInfo(architecture="llama", vocab_size=10, hidden_size=8, num_layers=1, num_heads=1,
                              num_kv_heads=1, head_dim=8, context_length=64, max_model_len=64, block_size=16,
                              num_blocks=1, kv_bytes_per_token=0, max_num_batched_tokens=64, parameter_count=1,
                              path=None, file_size=size)
        self.closed = False

    def shutdown(self) -> None:
        self.closed = True


class Catalogue(Catalog):
    """Names ``a``..``e`` each ``MB`` bytes, ``big`` 100 MB."""

    def names(self) -> list[str]:
        return ["a", "b", "c"]

    def ref(self, name: str) -> str | None:
        return name if name in ("a", "b", "c", "d", "e", "big") else None


def _manager(**lc: Any) -> tuple[ModelManager, list[str], dict[str, ScriptedClient]]:
    loads: list[str] = []
    clients: dict[str, ScriptedClient] = {}

    def load(name: str, ref: str) -> ServedModel:
        loads.append(name)
        clients[name] = ScriptedClient(100 * MB if name == "big" else MB)
        return ServedModel(name, clients[name], owned=True)

    started = ServedModel("pinned", ScriptedClient(MB), owned=False)
    mgr = ModelManager(Lifecycle(**{"max_loaded_models": 3, "max_loaded_memory": 10 * MB, "wait_seconds": 2.0,
                                    **lc}), load, Catalogue())
    mgr.add(started)
    return mgr, loads, clients


async def _use(mgr: ModelManager, name: str, keep_alive: object = DEFAULT,
               during: Callable[[], Awaitable[Any]] | None = None) -> ServedModel:
    """One request: acquire ``name``, run ``during``, release (as LeaseScope does)."""
    leases: list[Resident] = []
    token = _LEASES.set(leases)
    try:
        m = await mgr.acquire(name, keep_alive)
        if during is not None:
            await during()
        return m
    finally:
        _LEASES.reset(token)
        for r in leases:
            mgr.release(r)


async def _settle(mgr: ModelManager) -> None:
    for _ in range(50):
        await asyncio.sleep(0.01)
        if not mgr._leaving:
            return


def test_loads_once_and_evicts_the_least_recently_used() -> None:
    async def main() -> None:
        mgr, loads, clients = _manager()
        await _use(mgr, "a")
        await _use(mgr, "b")
        assert list(mgr.models) == ["pinned", "a", "b"] and loads == ["a", "b"]
        await _use(mgr, "a")                       # a used last: b is the least recently used
        await _use(mgr, "c")
        await _settle(mgr)
        assert sorted(mgr.models) == ["a", "c", "pinned"] and loads == ["a", "b", "c"]
        assert clients["b"].closed and not clients["a"].closed
        await _use(mgr, "b")                       # back again: now a goes (c was used after it)
        await _settle(mgr)
        assert sorted(mgr.models) == ["b", "c", "pinned"] and loads == ["a", "b", "c", "b"]
        assert "pinned" in mgr.models              # started with the server: never evicted
    asyncio.run(main())


def test_memory_limit_evicts_and_refuses_what_never_fits() -> None:
    async def main() -> None:
        mgr, loads, _ = _manager(max_loaded_models=10, max_loaded_memory=int(2.5 * MB))
        await _use(mgr, "a")
        await _use(mgr, "b")                       # pinned 1 + a 1 + b 1 > 2.5: a goes
        await _settle(mgr)
        assert sorted(mgr.models) == ["b", "pinned"]
        with pytest.raises(APIError) as ei:
            await _use(mgr, "big")
        assert ei.value.status == 503 and "--max-loaded-memory" in ei.value.message and loads[-1] == "big"
        await _settle(mgr)
        assert sorted(mgr.models) == ["b", "pinned"]      # loaded, found too big, unloaded again
        with pytest.raises(UnknownModel):
            await _use(mgr, "nope")
    asyncio.run(main())


def test_keep_alive_expires_and_zero_unloads_when_the_last_request_ends() -> None:
    async def main() -> None:
        mgr, _, clients = _manager(keep_alive=0.2)
        await _use(mgr, "a")
        r = next(r for r in mgr.residents() if r.model.name == "a")
        assert r.expires is not None and r.expires - time.time() <= 0.2
        await asyncio.sleep(0.4)
        await _settle(mgr)
        assert "a" not in mgr.models and clients["a"].closed
        await _use(mgr, "b", keep_alive=None)      # forever
        await asyncio.sleep(0.4)
        assert "b" in mgr.models

        async def check_still_loaded() -> None:
            await _use(mgr, "b", keep_alive=0)     # a second request asks for 0 while the first runs
            assert "b" in mgr.models               # ... the first still holds it
        await _use(mgr, "b", during=check_still_loaded)
        assert "b" not in mgr.models               # the last one ended: 0 applied at once
        await _settle(mgr)
        assert clients["b"].closed
    asyncio.run(main())


def test_a_model_in_use_is_never_unloaded_a_load_waits_for_it() -> None:
    async def main() -> None:
        mgr, loads, clients = _manager(max_loaded_models=2)
        gate = asyncio.Event()
        holder = asyncio.ensure_future(_use(mgr, "a", during=gate.wait))   # a in use
        await asyncio.sleep(0.05)
        first_a = clients["a"]
        waiter = asyncio.ensure_future(_use(mgr, "b"))                     # needs a's slot
        await asyncio.sleep(0.2)
        assert not waiter.done() and "a" in mgr.models and not clients["a"].closed
        late = asyncio.ensure_future(_use(mgr, "a"))    # a later request for a queues behind the load
        await asyncio.sleep(0.05)
        assert not late.done()
        gate.set()
        await asyncio.gather(holder, waiter, late)
        assert loads == ["a", "b", "a"] and first_a.closed and not clients["a"].closed
    asyncio.run(main())


def test_a_load_that_waits_too_long_is_refused() -> None:
    async def main() -> None:
        mgr, loads, _ = _manager(max_loaded_models=2, wait_seconds=0.2)
        gate = asyncio.Event()
        holder = asyncio.ensure_future(_use(mgr, "a", during=gate.wait))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as ei:
            await _use(mgr, "b")
        assert ei.value.status == 503 and ei.value.headers.get("Retry-After") and "in use" in ei.value.message
        gate.set()
        await holder
        await _use(mgr, "b")                       # now a is idle: it makes room
        assert loads == ["a", "b"]
    asyncio.run(main())


def test_only_started_models_in_the_way_is_refused_at_once() -> None:
    async def main() -> None:
        mgr, _, _ = _manager(max_loaded_models=1)
        t0 = time.monotonic()
        with pytest.raises(APIError) as ei:
            await _use(mgr, "a")
        assert ei.value.status == 503 and "started with the server" in ei.value.message
        assert time.monotonic() - t0 < 1.0
    asyncio.run(main())


def test_explicit_unload_waits_for_requests_in_flight() -> None:
    async def main() -> None:
        mgr, _, clients = _manager()
        gate = asyncio.Event()
        holder = asyncio.ensure_future(_use(mgr, "a", during=gate.wait))
        await asyncio.sleep(0.05)
        assert await mgr.unload("a") and "a" in mgr.models     # in use: unloads when it ends
        gate.set()
        await holder
        await _settle(mgr)
        assert "a" not in mgr.models and clients["a"].closed
        assert not await mgr.unload("a")
        assert await mgr.unload("pinned") and "pinned" in mgr.models
    asyncio.run(main())
