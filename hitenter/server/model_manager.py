"""The models a server holds (``ModelManager``), as Ollama's scheduler holds them; its options are a
``Lifecycle`` (hitenter/server/lifecycle.py).

- A request naming a model that is not resident loads it (one load at a time, off the event loop) from
  the server's Catalog (hitenter/server/model_catalog.py) through its ``Loader``; requests for a model
  being loaded wait for that load. While a load waits for models in use to finish, new requests for
  those models queue behind it (first come, first served: no model starves). The models the server
  started with stay loaded (the playground draws them) and count against the limits below.
- Every request holds a lease on its model from the moment it names it until its response has been
  sent (``LeaseScope``, an ASGI middleware, gives each HTTP request its scope). A model in use is never
  unloaded; an idle one unloads when its keep-alive runs out: that of the latest request to start on
  it, its ``keep_alive`` when it gave one, else the server's default (as Ollama does). ``keep_alive`` 0
  unloads it as soon as its last request ends.
- At most ``max_loaded_models`` models, and ``max_loaded_memory`` bytes of them (weights file plus the
  KV cache reserved for it), are resident: a load first unloads idle models, least recently used first;
  when only models in use stand in the way it waits for them (up to ``wait_seconds``), then is refused
  (503 with Retry-After). A model that could never fit is refused at once (503, saying why).

All state lives on the event loop's thread; loads and shutdowns run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from hitenter.errors import HitenterError
from hitenter.server.api_error import APIError
from hitenter.server.lifecycle import Lifecycle
from hitenter.server.model_catalog import Catalog
from hitenter.server.served_model import ServedModel

log = logging.getLogger("hitenter.server")

Loader = Callable[[str, str], ServedModel]     # (name, reference) -> a running model; blocking

DEFAULT = object()           # a request that gave no keep_alive: the model's default applies
FOREVER_AT = "9999-12-31T23:59:59Z"


class UnknownModel(LookupError):
    """No resident model and nothing in the catalog has this name."""


def model_bytes(m: ServedModel) -> int:
    """What a resident model holds at most: its weights file and the KV cache reserved for it."""
    i = m.client.info
    return int(i.file_size) + int(i.num_blocks) * int(i.block_size) * int(i.kv_bytes_per_token)


@dataclass(eq=False)
class Resident:
    model: ServedModel
    ref: str | None                  # the file it was loaded from on demand; None: started with the server, stays
    size: int
    default_keep_alive: float | None
    keep_alive: float | None
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires: float | None = None     # wall time (time.time) it unloads at while idle; None: not scheduled
    unload_when_idle: bool = False   # an unload asked while in use
    timer: asyncio.TimerHandle | None = None


_LEASES: contextvars.ContextVar[list[Resident] | None] = contextvars.ContextVar("hitenter_leases", default=None)
"""The models the current HTTP request holds (one entry per acquire), released by LeaseScope."""


class ModelManager:
    def __init__(self, lifecycle: Lifecycle | None = None, loader: Loader | None = None,
                 catalog: Catalog | None = None) -> None:
        """``loader`` and ``catalog``: how to load a model by name (None: only the models added)."""
        self.lifecycle = lifecycle or Lifecycle()
        self.loader, self.catalog = loader, catalog
        self._residents: dict[str, Resident] = {}
        self._leaving: set[asyncio.Future[None]] = set()
        self._lock = asyncio.Lock()
        self._starved = False          # a load waits for models in use: new requests for those queue behind it
        self._released = asyncio.Event()

    # what is held -------------------------------------------------------------------------------
    @property
    def models(self) -> dict[str, ServedModel]:
        """The resident models by name, in load order."""
        return {n: r.model for n, r in self._residents.items()}

    def residents(self) -> list[Resident]:
        return list(self._residents.values())

    def servable(self) -> list[str]:
        """Names a request can use: the resident models, then what the catalog can load."""
        more = self.catalog.names() if self.loader is not None and self.catalog is not None else []
        return list(dict.fromkeys([*self._residents, *more]))

    async def knows(self, name: str) -> bool:
        """Whether ``name`` is resident or could be loaded (without loading it)."""
        if name in self._residents:
            return True
        if not self.loads_on_demand():
            return False
        assert self.catalog is not None
        try:
            return await asyncio.to_thread(self.catalog.ref, name) is not None
        except (HitenterError, OSError):
            return True          # there, though it would fail to load

    def loads_on_demand(self) -> bool:
        return self.loader is not None and self.catalog is not None

    def add(self, model: ServedModel) -> None:
        """A model loaded at start (named on the command line, or given to the app as an engine): it stays
        loaded while the server runs."""
        self._residents[model.name] = Resident(model, None, model_bytes(model), None, None)

    # leases -------------------------------------------------------------------------------------
    async def acquire(self, name: str, keep_alive: object = DEFAULT) -> ServedModel:
        """The model ``name``, loaded when it is not resident, leased to the current HTTP request until
        its response is sent. UnknownModel when nothing has that name; APIError 400 when it fails to
        load, 503 when it cannot be made room for."""
        r = self._residents.get(name)
        if r is not None and not (self._starved and r.ref is not None):
            self._hold(r, keep_alive)
            return r.model
        async with self._lock:      # first come, first served: behind a load waiting for room
            r = self._residents.get(name) or await self._load(name)
            self._hold(r, keep_alive)
            return r.model

    def _hold(self, r: Resident, keep_alive: object) -> None:
        leases = _LEASES.get()
        if leases is None:            # outside an HTTP request (a tool or a test): nothing to count
            return
        r.users += 1
        r.last_used = time.monotonic()
        r.keep_alive = r.default_keep_alive if keep_alive is DEFAULT else keep_alive  # type: ignore[assignment]
        r.unload_when_idle = False
        r.expires = None
        if r.timer is not None:
            r.timer.cancel()
            r.timer = None
        leases.append(r)

    def release(self, r: Resident) -> None:
        """One lease on ``r`` ends (LeaseScope calls it as a request's response has been sent)."""
        r.users -= 1
        r.last_used = time.monotonic()
        if r.users == 0 and self._residents.get(r.model.name) is r:
            self._idle(r)
        self._released.set()
        self._released = asyncio.Event()

    def _idle(self, r: Resident) -> None:
        """Its last request ended: unload now, schedule its expiry, or keep it."""
        if r.ref is None:
            return
        if r.unload_when_idle or r.keep_alive == 0:
            self._unload(r)
            return
        if r.keep_alive is None:
            return
        r.expires = time.time() + r.keep_alive
        r.timer = asyncio.get_running_loop().call_later(r.keep_alive, self._expired, r)

    def _expired(self, r: Resident) -> None:
        r.timer = None
        if self._residents.get(r.model.name) is r and r.users == 0:
            self._unload(r)

    async def unload(self, name: str) -> bool:
        """Unload ``name`` now, or as soon as its requests end (an empty request with keep_alive 0);
        False when it is not resident. One the server started with stays (True: it is served)."""
        r = self._residents.get(name)
        if r is None:
            return False
        if r.ref is None:
            return True
        if r.users:
            r.unload_when_idle = True
            return True
        await self._unload(r)
        return True

    # loading and unloading ----------------------------------------------------------------------
    def _unload(self, r: Resident) -> asyncio.Future[None]:
        """Take ``r`` out of the resident set now; its engine shuts down in a worker thread."""
        del self._residents[r.model.name]
        if r.timer is not None:
            r.timer.cancel()
            r.timer = None
        log.info("unloading model %s (%d bytes)", r.model.name, r.size)
        fut = asyncio.ensure_future(asyncio.to_thread(_shutdown, r.model))
        self._leaving.add(fut)
        fut.add_done_callback(self._left)
        return fut

    def _left(self, fut: asyncio.Future[None]) -> None:
        self._leaving.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            log.error("shutting a model down failed: %r", fut.exception())
        self._released.set()
        self._released = asyncio.Event()

    async def _load(self, name: str) -> Resident:
        if self.loader is None or self.catalog is None:
            raise UnknownModel(name)
        try:
            ref = await asyncio.to_thread(self.catalog.ref, name)
        except (HitenterError, OSError) as e:
            raise APIError(400, f"model '{name}' cannot be loaded: {e}", "model") from e
        if ref is None:
            raise UnknownModel(name)
        await self._make_room(name, _file_bytes(ref))
        t0 = time.monotonic()
        model = await self._run_loader(name, ref)
        r = Resident(model, ref, model_bytes(model), self.lifecycle.keep_alive, self.lifecycle.keep_alive)
        self._residents[name] = r
        log.info("loaded model %s from %s in %.1f s (%d bytes)", name, ref, time.monotonic() - t0, r.size)
        self._trim(r)
        return r

    async def _run_loader(self, name: str, ref: str) -> ServedModel:
        assert self.loader is not None
        fut = asyncio.ensure_future(asyncio.to_thread(self.loader, name, ref))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:        # the request went away mid-load: the model is not kept
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else _shutdown(f.result()))
            raise
        except (HitenterError, ValueError, OSError) as e:
            raise APIError(400, f"model '{name}' could not be loaded: {e}", "model") from e

    def _used(self) -> int:
        return sum(r.size for r in self._residents.values())

    def _fits(self, need: int) -> bool:
        lc = self.lifecycle
        return len(self._residents) < lc.max_loaded_models and self._used() + need <= lc.memory_limit()

    def _idle_lru(self, spare: Resident | None = None) -> Resident | None:
        idle = [r for r in self._residents.values() if r.users == 0 and r.ref is not None and r is not spare]
        return min(idle, key=lambda r: r.last_used, default=None)

    async def _make_room(self, name: str, need: int) -> None:
        """Unload idle models (least recently used first) until ``need`` more bytes and one more model
        fit; wait for models in use to become idle, at most ``wait_seconds``."""
        limit, lc = self.lifecycle.memory_limit(), self.lifecycle
        if need > limit:
            raise APIError(503, f"model '{name}' needs at least {need} bytes, more than this server's "
                           f"--max-loaded-memory of {limit} bytes: it cannot be loaded here", "model")
        deadline = time.monotonic() + lc.wait_seconds
        while True:
            if self._leaving:
                await asyncio.gather(*self._leaving, return_exceptions=True)
            if self._fits(need):
                return
            victim = self._idle_lru()
            if victim is not None:
                await self._unload(victim)
                continue
            if not any(r.ref is not None for r in self._residents.values()):
                raise APIError(503, f"cannot load model '{name}': the resident models "
                               f"{sorted(self._residents)} stay loaded (started with the server) and no room "
                               f"is left (--max-loaded-models {lc.max_loaded_models}, --max-loaded-memory "
                               f"{limit} bytes)", "model")
            left = deadline - time.monotonic()
            if left <= 0:
                raise APIError(503, f"cannot load model '{name}' now: the resident models "
                               f"{sorted(self._residents)} are all in use (--max-loaded-models "
                               f"{lc.max_loaded_models}, --max-loaded-memory {limit} bytes); try again",
                               "model", headers={"Retry-After": "5"})
            released, self._starved = self._released, True
            try:
                await asyncio.wait_for(released.wait(), left)
            except TimeoutError:
                pass
            finally:
                self._starved = False

    def _trim(self, new: Resident) -> None:
        """After a load its true size is known: unload idle models while the total is over the limit; a
        model larger than the limit by itself is unloaded again and refused (503)."""
        limit = self.lifecycle.memory_limit()
        if new.size > limit:
            self._unload(new)
            raise APIError(503, f"model '{new.model.name}' needs {new.size} bytes (weights and KV cache), more "
                           f"than this server's --max-loaded-memory of {limit} bytes: it cannot be loaded here",
                           "model")
        while self._used() > limit:
            victim = self._idle_lru(spare=new)
            if victim is None:       # the others are in use: over the limit until they are idle
                log.warning("resident models hold %d bytes, over the %d-byte limit", self._used(), limit)
                return
            self._unload(victim)

    async def close(self) -> None:
        """Shut down every resident model the server created (the app's shutdown)."""
        for r in list(self._residents.values()):
            if r.timer is not None:
                r.timer.cancel()
            if r.model.owned:
                self._unload(r)
        if self._leaving:
            await asyncio.gather(*self._leaving, return_exceptions=True)


def _file_bytes(ref: str) -> int:
    try:
        return Path(ref).stat().st_size
    except OSError:
        return 0


def _shutdown(m: ServedModel) -> None:
    if m.owned:
        m.client.shutdown()
    gc.collect()      # the model's tensors are freed with the last reference


def expires_at(r: Resident) -> float | None:
    """Wall time ``r`` unloads at (None: not while it is idle as now, i.e. forever or unknown)."""
    if r.users and r.keep_alive is not None and r.ref is not None:
        return time.time() + r.keep_alive
    return r.expires


class LeaseScope:
    """ASGI middleware: the leases an HTTP request takes (ModelManager.acquire) are released once its
    response has been sent, whatever way it ends (streams included)."""

    def __init__(self, app: ASGIApp, manager: ModelManager) -> None:
        self.app, self.manager = app, manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        leases: list[Resident] = []
        token = _LEASES.set(leases)
        try:
            await self.app(scope, receive, send)
        finally:
            _LEASES.reset(token)
            for r in leases:
                self.manager.release(r)
