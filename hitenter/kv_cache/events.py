"""KV cache events and snapshots: what a live block map (the playground) and the tests observe.

Event kinds (``KVEvent.kind``), in the order the manager emits them within one call:

- ``"share"``: prefix-hit blocks taken by ``request_id`` (ref counts after the increment).
- ``"evict"``: cached blocks whose hash was dropped because they were reused for a new allocation
  (``request_id`` is the allocating request). Their content is gone from the prefix cache.
- ``"alloc"``: fresh blocks given to ``request_id`` (ref count 1 each).
- ``"cache"``: blocks of ``request_id`` that became full of verified tokens and are now hittable.
- ``"free"``: blocks released by ``request_id`` in release order (tail first); ``ref_cnts`` after the
  decrement: 0 means the block went to the free queue (keeping its hash, if any).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KVEventKind = Literal["alloc", "share", "cache", "free", "evict"]


@dataclass(frozen=True)
class KVEvent:
    """One change to the block map. ``ref_cnts[i]`` is block ``block_ids[i]``'s ref count after the event."""

    kind: KVEventKind
    request_id: str | None
    block_ids: tuple[int, ...]
    ref_cnts: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly form for the web UI."""
        return {"kind": self.kind, "request_id": self.request_id,
                "block_ids": list(self.block_ids), "ref_cnts": list(self.ref_cnts)}


@dataclass(frozen=True)
class BlockState:
    """One block in ``KVCacheManager.snapshot()``.

    ``free`` blocks have ``ref_cnt == 0`` and no owners; ``hashed`` blocks are prefix-cache hittable
    (a free hashed block is cached content waiting to be either hit again or evicted).
    """

    block_id: int
    ref_cnt: int
    owners: tuple[str, ...]
    hashed: bool
    free: bool

    def to_dict(self) -> dict[str, object]:
        return {"block_id": self.block_id, "ref_cnt": self.ref_cnt, "owners": list(self.owners),
                "hashed": self.hashed, "free": self.free}


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since start (or the last reset): requests, tokens queried, tokens hit."""

    requests: int = 0
    queries: int = 0     # tokens looked up
    hits: int = 0        # tokens served from the cache

    @property
    def hit_rate(self) -> float:
        """hits / queries in tokens; 0.0 before any query."""
        return self.hits / self.queries if self.queries else 0.0
