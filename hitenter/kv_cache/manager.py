"""KVCacheManager: the scheduler's only door to the KV cache, and the coordinator of its cache groups.

Per request it keeps a block table (block ids, in token order) and the chained hashes of the table's
leading blocks that are full of verified tokens. Contracts:

- ``get_computed_blocks(req)`` finds the longest chain of cached full blocks matching the request's
  tokens (prompt + outputs, so a preempted request re-hits its own blocks), capped so at least the
  last token is recomputed: hit tokens <= num_tokens - 1, in whole blocks. It touches nothing.
- ``allocate_slots(req, n, hits)`` is all or nothing: on None nothing changed (no leak, no event).
- ``cache_blocks(req, num_verified)`` registers only blocks full of verified tokens.
- ``free(req)`` releases the table tail first, so tail blocks are evicted first; ``trim(req, n)``
  releases only the tail blocks beyond the first ``n`` tokens (rejected speculative tokens).
- Ownership: every block's ref_cnt equals the number of live tables holding it; a block appears at
  most once in a table; when all requests are gone every block is free (``check_invariants``).

Cache groups (hitenter/kv_cache/cache_group.py): the manager keeps the global group itself (the full-attention
layers' block tables and hash chain) and coordinates the others in ``groups``, calling each the same way:
a prefix hit is cut to what every group can serve, an allocation fits every group or none, verified
tokens, trims, frees and resets reach every group. The groups a model has:
- sliding-window layers (``local_window``, ``num_local_blocks``): ``local``, their own pool and tables that
  release the blocks the window left (window_group.py); ``local_block_table`` is its table;
- recurrent layers of a hybrid model (``num_state_slots``): ``state``, a live state slot per running
  request and state snapshots keyed by the block-hash chain (state_group.py); ``state_step`` plans a
  step's restore and saves.

Events (``KVEvent``) go to ``on_event`` (a public, settable attribute) and to every ``subscribe``d
listener, synchronously, after the state change.
"""

from __future__ import annotations

from collections.abc import Callable

from hitenter.kv_cache.block_pool import BlockPool
from hitenter.kv_cache.cache_group import CacheGroup
from hitenter.kv_cache.events import BlockState, KVEvent, KVEventKind, PrefixCacheStats
from hitenter.kv_cache.hashing import BlockHash, hash_block_tokens, with_extra_keys
from hitenter.kv_cache.state_group import StateGroup, StateStep
from hitenter.kv_cache.window_group import WindowGroup
from hitenter.request import Request, RequestStatus

EventListener = Callable[[KVEvent], None]


class KVCacheManager:
    """Block tables, prefix hits, allocation and release for all live requests."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 on_event: EventListener | None = None, local_window: int | None = None,
                 num_local_blocks: int | None = None, num_state_slots: int = 0) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size: must be > 0, got {block_size}")
        self.state: StateGroup | None = StateGroup(num_state_slots, block_size) if num_state_slots else None
        self.local: WindowGroup | None = None if not local_window else WindowGroup(
            num_blocks if num_local_blocks is None else num_local_blocks, block_size, local_window,
            enable_prefix_caching)
        self.groups: list[CacheGroup] = [g for g in (self.local, self.state) if g is not None]
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.on_event: EventListener | None = on_event
        self._listeners: list[EventListener] = []
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[BlockHash]] = {}   # hashes of the table's leading verified full blocks
        self.prefix_cache_stats = PrefixCacheStats()
        self.hash_fn: Callable[[BlockHash | None, list[int]], BlockHash] = hash_block_tokens  # tests may swap

    # ---- observers ----------------------------------------------------------------------------
    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add an event listener (besides ``on_event``); returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _emit(self, kind: KVEventKind, request_id: str | None, block_ids: list[int]) -> None:
        if not block_ids or (self.on_event is None and not self._listeners):
            return
        ev = KVEvent(kind, request_id, tuple(block_ids),
                     tuple(self.pool.blocks[b].ref_cnt for b in block_ids))
        if self.on_event is not None:
            self.on_event(ev)
        for fn in list(self._listeners):
            fn(ev)

    # ---- counts ---------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any live request (cached-but-free blocks count as free)."""
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks (or state slots) held by live requests, 0.0..1.0: the fullest group's."""
        return max([self.pool.usage] + [g.usage for g in self.groups])

    def block_table(self, request_id: str) -> list[int]:
        """A copy of the request's block table ([] when it holds none)."""
        return list(self._tables.get(request_id, ()))

    def local_block_table(self, request_id: str) -> list[int] | None:
        """A copy of the request's local-group table (placeholders for released entries); None without one."""
        return None if self.local is None else list(self.local.tables.get(request_id, ()))

    def held_blocks(self, request_id: str) -> tuple[int, int]:
        """(global blocks, local blocks) the request owns (local 0 without a local group)."""
        return len(self._tables.get(request_id, ())), 0 if self.local is None else len(self.local.owned(request_id))

    def max_context_tokens(self, chunk_tokens: int) -> int:
        """The most tokens one request alone can hold when steps compute up to ``chunk_tokens`` at a time."""
        n = self.num_blocks * self.block_size
        if self.local is not None:
            peak = self.num_blocks_needed(self.local.window + chunk_tokens) + 1
            if peak > self.local.pool.num_blocks:
                n = min(n, self.local.pool.num_blocks * self.block_size)
        return n

    def num_blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- the scheduler's calls ----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of the request's tokens: (block ids, number of tokens they hold).

        Capped at ``(num_tokens - 1) // block_size`` blocks so the last token is always computed.
        Returns ([], 0) when caching is off or the request already holds blocks. Pure lookup: the
        scheduler may call it every step for a waiting head that does not fit yet.
        """
        if not self.enable_prefix_caching or self._tables.get(request.request_id):
            return [], 0
        bs = self.block_size
        max_blocks = max(request.num_tokens - 1, 0) // bs
        hits: list[int] = []
        parent: BlockHash | None = None
        for i in range(max_blocks):
            chunk = request.token_slice(i * bs, (i + 1) * bs)
            h = self._block_hash(request, parent, i, chunk)
            bid = self.pool.get_cached_block(h, chunk, parent)
            if bid is None:
                break
            hits.append(bid)
            parent = h
        hashes: list[BlockHash] = [self.pool.blocks[b].block_hash for b in hits]   # type: ignore[misc]
        n = request.image_floor(len(hits) * bs) // bs   # a hit never ends inside an image (its rows go together)
        while self.groups:   # every group must serve the hit: cut it until all of them can
            cut = min(g.cut_hit(hashes[:n], self._chunks(request)) for g in self.groups)
            cut = request.image_floor(cut * bs) // bs
            if cut == n:
                break
            n = cut
        del hits[n:]
        return hits, len(hits) * bs

    def _block_hash(self, request: Request, parent: BlockHash | None, i: int, chunk: list[int]) -> BlockHash:
        """Block i's chained hash: its tokens, and the content keys of the images with rows in it."""
        h = self.hash_fn(parent, chunk)
        if request.images:
            keys = request.image_keys(i * self.block_size, (i + 1) * self.block_size)
            if keys:
                h = with_extra_keys(h, keys)
        return h

    def _chunks(self, request: Request):  # noqa: ANN202 -- a block index -> its tokens
        bs = self.block_size
        return lambda i: request.token_slice(i * bs, (i + 1) * bs)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[int] | None = None) -> list[int] | None:
        """Ensure blocks for ``num_computed_tokens + len(hits) * block_size + num_new_tokens`` tokens.

        ``new_computed_blocks`` (prefix hits from ``get_computed_blocks``) are only for a request that
        holds no blocks yet; they are touched (ref_cnt += 1) and put at the head of its table.
        Returns the newly allocated block ids (maybe []), or None when they do not fit (no change).
        The first successful allocation of a WAITING request records the prefix-cache stats.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens: must be >= 0, got {num_new_tokens}")
        rid = request.request_id
        hits = list(new_computed_blocks or ())
        table = self._tables.get(rid, [])
        if hits and table:
            raise ValueError(f"request {rid!r} already holds blocks; prefix hits are for fresh requests only")
        total = request.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        num_new = max(self.num_blocks_needed(total) - len(table) - len(hits), 0)
        reclaim = sum(1 for b in hits if self.pool.blocks[b].ref_cnt == 0)  # hits leaving the free queue
        if num_new + reclaim > self.pool.num_free_blocks:
            return None
        hit_hashes: list[BlockHash] = [self.pool.blocks[b].block_hash for b in hits]   # type: ignore[misc]
        chunk, computed = self._chunks(request), request.num_computed_tokens
        if not all(g.fits(rid, self.num_blocks_needed(total), hit_hashes, chunk, computed) for g in self.groups):
            return None
        if self.enable_prefix_caching and not table and request.status is RequestStatus.WAITING:
            st = self.prefix_cache_stats   # counted once per admission; not for a preempted request's re-hits
            st.requests += 1
            st.queries += request.num_tokens
            st.hits += len(hits) * self.block_size
        if hits:
            self.pool.touch(hits)
            table = self._tables[rid] = list(hits)
            self._hashes[rid] = [self.pool.blocks[b].block_hash for b in hits]  # type: ignore[misc]
            self._emit("share", rid, hits)
        evicted: list[int] = []
        new = self.pool.get_new_blocks(num_new, evicted)
        self._emit("evict", rid, evicted)
        if rid not in self._tables:
            self._tables[rid] = table
            self._hashes[rid] = []
        table.extend(new)
        self._emit("alloc", rid, new)
        for g in self.groups:
            g.allocate(rid, len(table), hit_hashes, chunk, computed)
        return new

    def cache_blocks(self, request: Request, num_verified_tokens: int) -> None:
        """Register the request's blocks that are now full of verified (computed) tokens.

        Call with the request's verified token count (e.g. ``num_computed_tokens`` after a step);
        drafted or otherwise unconfirmed tokens must not be counted. Idempotent. Then every group hears of
        the verified tokens (a local group releases what no later row reads; the state group registers the
        snapshots they cover).
        """
        self._cache_blocks(request, num_verified_tokens)
        rid = request.request_id
        for g in self.groups:
            g.verified(rid, self._hashes.get(rid, []), self._chunks(request), num_verified_tokens,
                       request.num_prompt_tokens)

    def state_step(self, request: Request, num_new_tokens: int) -> StateStep | None:
        """The recurrent state's work for the request's next ``num_new_tokens`` rows (from its computed
        tokens): its live slot, the restore due before them, the snapshots to save. None without recurrent
        layers. Call once per scheduled step, after ``allocate_slots``."""
        if self.state is None:
            return None
        drafts = max(0, min(len(request.spec_token_ids), num_new_tokens - 1))
        return self.state.plan(request.request_id, request.num_computed_tokens, num_new_tokens,
                               request.num_prompt_tokens, self.enable_prefix_caching, drafts)

    def _cache_blocks(self, request: Request, num_verified_tokens: int) -> None:
        rid = request.request_id
        table = self._tables.get(rid)
        if not self.enable_prefix_caching or not table:
            return
        hashes = self._hashes[rid]
        n_full = min(num_verified_tokens // self.block_size, len(table))
        if n_full <= len(hashes):
            return
        bs = self.block_size
        new_cached: list[int] = []
        for i in range(len(hashes), n_full):
            parent = hashes[-1] if hashes else None
            chunk = request.token_slice(i * bs, (i + 1) * bs)
            h = self._block_hash(request, parent, i, chunk)
            if self.pool.cache_full_block(table[i], h, chunk, parent):
                new_cached.append(table[i])
            hashes.append(h)
        self._emit("cache", rid, new_cached)

    def free(self, request: Request) -> None:
        """Release all of the request's blocks, tail first. Unknown / blockless requests are a no-op."""
        rid = request.request_id
        table = self._tables.pop(rid, None)
        self._hashes.pop(rid, None)
        for g in self.groups:
            g.free(rid)
        if not table:
            return
        order = table[::-1]
        self.pool.free_blocks(order)
        self._emit("free", rid, order)

    def trim(self, request: Request, num_tokens: int) -> None:
        """Release the table's tail blocks not needed for the first ``num_tokens`` tokens (tail first).

        Never releases a block holding verified cached tokens (callers pass >= the verified count)."""
        rid = request.request_id
        table = self._tables.get(rid)
        if not table:
            return
        keep = max(self.num_blocks_needed(num_tokens), len(self._hashes.get(rid, ())))
        for g in self.groups:
            g.trim(rid, keep)
        if keep >= len(table):
            return
        order = table[keep:][::-1]
        del table[keep:]
        self.pool.free_blocks(order)
        self._emit("free", rid, order)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; only possible when no request holds blocks. Returns success."""
        if not all(g.resettable() for g in self.groups):
            return False
        ok = self.pool.reset_prefix_cache()
        if ok:
            for g in self.groups:
                g.reset()
        return ok

    # ---- introspection ---------------------------------------------------------------------------------
    def snapshot(self) -> list[BlockState]:
        """Per-block state for a block map: owners (request ids), ref count, hashed, free."""
        owners: dict[int, list[str]] = {}
        for rid, table in self._tables.items():
            for b in table:
                owners.setdefault(b, []).append(rid)
        return [BlockState(blk.block_id, blk.ref_cnt, tuple(owners.get(blk.block_id, ())),
                           blk.block_hash is not None, blk.ref_cnt == 0)
                for blk in self.pool.blocks]

    def check_invariants(self) -> None:
        """Raise AssertionError if ownership, ref counts, free queue or hashes disagree."""
        self.pool.check_invariants()
        for g in self.groups:
            g.check_invariants(self._tables)
        holders = [0] * self.pool.num_blocks
        for rid, table in self._tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"request {rid!r} holds a block twice: {table}")
            if len(self._hashes.get(rid, ())) > len(table):
                raise AssertionError(f"request {rid!r} has more hashes than blocks")
            for b in table:
                holders[b] += 1
        for blk in self.pool.blocks:
            if blk.ref_cnt != holders[blk.block_id]:
                raise AssertionError(f"{blk}: ref_cnt != {holders[blk.block_id]} live holders")
