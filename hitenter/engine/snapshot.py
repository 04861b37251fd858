"""What other threads may read of a running engine: a snapshot published after every step.

``LLMEngine.snapshot()`` returns the latest ``EngineSnapshot`` (immutable; replaced, never mutated):
queue lengths, KV usage and free blocks, prefix-cache hit rate, the scheduler's stats, the step
counter, and (while someone asked for it within ``KV_VIEW_TTL_S``) the KV block map. Reading it never
waits on a step. ``SnapshotView`` dresses a snapshot as the engine attributes old readers used
(``view.scheduler.num_waiting``, ``view.kv_manager.snapshot()``, ``view.step_counter``, ...): what
``AsyncLLMEngine.run_on_snapshot(fn, engine)`` passes ``fn`` in the engine's place.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from hitenter.engine.scheduler import Scheduler, SchedulerStats
from hitenter.kv_cache.events import BlockState
from hitenter.kv_cache.manager import KVCacheManager

KV_VIEW_TTL_S = 5.0       # the block map is published each step for this long after a read asked for it


@dataclass(frozen=True)
class EngineSnapshot:
    step_counter: int                    # steps that ran work
    scheduler: SchedulerStats            # running / waiting / preemptions / KV usage / prefix-cache counters
    num_blocks: int
    block_size: int
    kv_blocks: tuple[BlockState, ...] | None = None   # the block map, when it was asked for
    free_order: tuple[int, ...] = ()     # head of the free queue (with kv_blocks)
    published: float = 0.0               # time.monotonic() at publication

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv_usage

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.num_free_blocks


def take_snapshot(scheduler: Scheduler, kv: KVCacheManager, step_counter: int, with_blocks: bool) -> EngineSnapshot:
    """Engine thread only."""
    blocks = tuple(kv.snapshot()) if with_blocks else None
    free = tuple(itertools.islice(kv.pool.free_queue, 64)) if with_blocks else ()
    return EngineSnapshot(step_counter, scheduler.stats, kv.num_blocks, kv.block_size, blocks, free,
                          time.monotonic())


class _Stats:
    def __init__(self, snap: EngineSnapshot) -> None:
        self.queries, self.hits = snap.scheduler.prefix_cache_queries, snap.scheduler.prefix_cache_hits
        self.hit_rate = snap.scheduler.prefix_cache_hit_rate


class _KVView:
    def __init__(self, snap: EngineSnapshot) -> None:
        self._snap = snap
        self.num_blocks, self.block_size = snap.num_blocks, snap.block_size
        self.num_free_blocks, self.usage = snap.num_free_blocks, snap.kv_usage
        self.prefix_cache_stats = _Stats(snap)
        self.pool = type("Pool", (), {"free_queue": list(snap.free_order)})()

    def snapshot(self) -> list[BlockState]:
        return list(self._snap.kv_blocks or ())


class _SchedView:
    def __init__(self, snap: EngineSnapshot) -> None:
        self.num_running, self.num_waiting, self.stats = snap.num_running, snap.num_waiting, snap.scheduler


class SnapshotView:
    """A snapshot wearing the engine's attribute names (read-only; see module docstring)."""

    def __init__(self, engine: Any, snap: EngineSnapshot) -> None:
        self._engine = engine
        self.step_counter = snap.step_counter
        self.kv_manager = _KVView(snap)
        self.scheduler = _SchedView(snap)

    def __getattr__(self, name: str) -> Any:     # static attributes (tokenizer, model_config, max_model_len, ...)
        return getattr(self._engine, name)
