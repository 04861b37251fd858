"""CacheGroup: one group of layers whose cache follows the global block tables' tokens, as the coordinator
(KVCacheManager, hitenter/kv_cache/manager.py) sees it.

The coordinator owns the global group (every full-attention layer: one block table per request, the prefix
cache's hash chain). Each other group -- the sliding-window layers' own tables (window_group.py), a hybrid
model's recurrent-state slots (state_group.py) -- answers the same calls, made in the same order for every
group, so a prefix hit, an allocation, a release or a reset covers all groups or none:

- ``cut_hit(hashes, chunk)``: of a prefix hit of ``len(hashes)`` blocks, how many leading blocks this group
  can serve (the hit is cut to the smallest answer). Pure.
- ``fits(rid, total_blocks, hashes, chunk, num_computed)``: whether growing ``rid`` to ``total_blocks``
  blocks (``hashes``: the prefix hit of a fresh request) fits. Pure.
- ``allocate(...)`` (same arguments): do it; called only after every group said it fits.
- ``verified(rid, hashes, chunk, num_verified, num_prompt)``: the request's tokens up to ``num_verified`` are
  computed and confirmed; ``hashes`` is its whole verified hash chain.
- ``trim(rid, keep_blocks)``, ``free(rid)``: release what a request no longer needs / everything it holds.
- ``resettable()`` then ``reset()``: drop the group's prefix-cache entries when nothing is held.
- ``usage`` (0..1 of the group's capacity held by live requests); ``check_invariants(tables)`` against the
  coordinator's live tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hitenter.kv_cache.hashing import BlockHash

Chunk = Callable[[int], Sequence[int]]   # block index -> its token ids


class CacheGroup:
    """The calls above; a group overrides what it keeps (the defaults keep nothing)."""

    def cut_hit(self, hashes: list[BlockHash], chunk: Chunk) -> int:
        return len(hashes)

    def fits(self, rid: str, total_blocks: int, hashes: list[BlockHash], chunk: Chunk, num_computed: int) -> bool:
        return True

    def allocate(self, rid: str, total_blocks: int, hashes: list[BlockHash], chunk: Chunk,
                 num_computed: int) -> None:
        return None

    def verified(self, rid: str, hashes: list[BlockHash], chunk: Chunk, num_verified: int, num_prompt: int) -> None:
        return None

    def trim(self, rid: str, keep_blocks: int) -> None:
        return None

    def free(self, rid: str) -> None:
        return None

    def resettable(self) -> bool:
        return True

    def reset(self) -> None:
        return None

    @property
    def usage(self) -> float:
        return 0.0

    def check_invariants(self, tables: dict[str, list[int]]) -> None:
        return None
