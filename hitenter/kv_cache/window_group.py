"""WindowGroup: the block tables of the sliding-window (local) layers, which release what their window left.

A model with sliding-window layers (Gemma 2/3, gpt-oss) has two layer groups: the global layers keep every
block (KVCacheManager's own tables), the local layers -- the cache tensors of the windowed layers, with
their own block ids -- need only the blocks their window still reaches. vLLM v1's hybrid KV cache manager
(SlidingWindowManager) frees those; this is that idea with one table per request the same length as the
global one, so a token's block index is the same in both and the kernels' table offsets are shared.

Contracts:
- Entry i of a request's local table holds tokens ``[i * bs, (i + 1) * bs)`` of the local layers. The first
  ``released`` entries are *placeholders* (``PLACEHOLDER``, a valid id that is never read: a row at position p
  reads keys from ``p - window + 1`` on, and the GEMM path masks what it gathers there); the others are owned.
- ``first_needed(num_computed)``: the first block the next row (position ``num_computed``) can read; the
  manager releases the entries before it when it allocates for a step, never blocks of this step's rows.
- Prefix caching: the local blocks carry the same chained hashes as the global ones and stay hittable in
  their pool after release until evicted. A prefix hit of h blocks needs the local blocks its first new row
  can read (``first_needed(h * bs) .. h - 1``) cached too; ``hit_blocks`` says whether they are.
- The local group emits no KV events (the events and the playground's block map describe the global group).
"""

from __future__ import annotations

from collections.abc import Sequence

from hitenter.kv_cache.block_pool import BlockPool
from hitenter.kv_cache.cache_group import CacheGroup, Chunk
from hitenter.kv_cache.hashing import BlockHash

PLACEHOLDER = 0


class WindowGroup(CacheGroup):
    """The local layers' pool and per-request tables (same length as the global tables)."""

    def __init__(self, num_blocks: int, block_size: int, window: int, enable_caching: bool) -> None:
        if window <= 0:
            raise ValueError(f"window: must be > 0, got {window}")
        self.window = window
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching)
        self.tables: dict[str, list[int]] = {}
        self.released: dict[str, int] = {}   # leading placeholder entries per request
        self.cached: dict[str, int] = {}     # leading entries whose hash is registered (or released)

    def first_needed(self, num_computed: int) -> int:
        """Index of the first block a row at position ``num_computed`` (or later) reads."""
        return max(0, num_computed - self.window + 1) // self.block_size

    def owned(self, rid: str) -> list[int]:
        """The request's owned block ids (its table past the placeholders)."""
        return self.tables.get(rid, [])[self.released.get(rid, 0):]

    def hit_blocks(self, hashes: Sequence[BlockHash], chunk: Chunk) -> list[int] | None:
        """For a prefix hit of ``len(hashes)`` blocks: the cached local blocks its first new row reads
        (entries ``first_needed(h * bs) .. h - 1``), or None when one of them is not cached here."""
        h = len(hashes)
        out: list[int] = []
        for i in range(self.first_needed(h * self.block_size), h):
            bid = self.pool.get_cached_block(hashes[i], chunk(i), hashes[i - 1] if i else None)
            if bid is None:
                return None
            out.append(bid)
        return out

    # ---- the coordinator's calls (cache_group.py) ------------------------------------------------------
    def cut_hit(self, hashes: list[BlockHash], chunk: Chunk) -> int:
        n = len(hashes)
        while n and self.hit_blocks(hashes[:n], chunk) is None:
            n -= 1
        return n

    def _hits(self, rid: str, hashes: list[BlockHash], chunk: Chunk) -> list[int]:
        lhits = self.hit_blocks(hashes, chunk) if hashes else []
        if lhits is None:
            raise ValueError(f"request {rid!r}: prefix hits whose local blocks are not cached")
        return lhits

    def fits(self, rid: str, total_blocks: int, hashes: list[BlockHash], chunk: Chunk, num_computed: int) -> bool:
        lhits, lp = self._hits(rid, hashes, chunk), self.pool
        new = self.num_new(rid, total_blocks, len(hashes))
        reclaim = sum(1 for b in lhits if lp.blocks[b].ref_cnt == 0)
        back = sum(1 for b in self.releasable(rid, num_computed) if lp.blocks[b].ref_cnt == 1)
        return new + reclaim <= lp.num_free_blocks + back

    def allocate(self, rid: str, total_blocks: int, hashes: list[BlockHash], chunk: Chunk,
                 num_computed: int) -> None:
        self.grow(rid, total_blocks, self._hits(rid, hashes, chunk), len(hashes), num_computed)

    def verified(self, rid: str, hashes: list[BlockHash], chunk: Chunk, num_verified: int, num_prompt: int) -> None:
        """Register the newly verified full blocks, then release what no row from ``num_verified`` on reads."""
        self.cache(rid, hashes, chunk)
        self.release(rid, num_verified)

    def resettable(self) -> bool:
        return self.pool.num_free_blocks == self.pool.num_blocks

    def reset(self) -> None:
        self.pool.reset_prefix_cache()

    @property
    def usage(self) -> float:
        return self.pool.usage

    # ---- the group's own bookkeeping ---------------------------------------------------------------------
    def releasable(self, rid: str, num_computed: int) -> list[int]:
        """Owned entries wholly before the window of position ``num_computed`` (not released yet)."""
        table = self.tables.get(rid)
        if not table:
            return []
        return table[self.released.get(rid, 0):min(self.first_needed(num_computed), len(table))]

    def num_new(self, rid: str, total_blocks: int, num_hits: int) -> int:
        return max(total_blocks - len(self.tables.get(rid, ())) - num_hits, 0)

    def grow(self, rid: str, total_blocks: int, hits: list[int], num_hit_blocks: int, num_computed: int) -> None:
        """Release what the window left, then extend the table to ``total_blocks`` entries: placeholders for
        the hit blocks no row reads, then the local ``hits`` (touched), then new blocks. Caller checked the fit."""
        self.release(rid, num_computed)
        table = self.tables.setdefault(rid, [])
        if not table and num_hit_blocks:
            skip = num_hit_blocks - len(hits)
            self.pool.touch(hits)
            table.extend([PLACEHOLDER] * skip + hits)
            self.released[rid] = skip
            self.cached[rid] = num_hit_blocks
        self.released.setdefault(rid, 0)
        self.cached.setdefault(rid, 0)
        table.extend(self.pool.get_new_blocks(max(total_blocks - len(table), 0)))

    def release(self, rid: str, num_computed: int) -> None:
        """Return the entries the window left to the pool (oldest evicted first); placeholders stay."""
        dead = self.releasable(rid, num_computed)
        if not dead:
            return
        table, start = self.tables[rid], self.released[rid]
        self.pool.free_blocks(dead)
        table[start:start + len(dead)] = [PLACEHOLDER] * len(dead)
        self.released[rid] = start + len(dead)
        self.cached[rid] = max(self.cached[rid], self.released[rid])

    def cache(self, rid: str, hashes: Sequence[BlockHash], chunk: Chunk) -> None:
        """Register the owned entries up to ``len(hashes)`` (full, verified blocks) under the global chain."""
        table = self.tables.get(rid)
        if not table:
            return
        n = min(len(hashes), len(table))
        for i in range(max(self.cached[rid], self.released[rid]), n):
            self.pool.cache_full_block(table[i], hashes[i], chunk(i), hashes[i - 1] if i else None)
        self.cached[rid] = max(self.cached[rid], n)

    def trim(self, rid: str, keep: int) -> None:
        """Release the owned tail entries past ``keep`` (tail first)."""
        table = self.tables.get(rid)
        if not table:
            return
        keep = max(keep, self.released[rid])
        if keep < len(table):
            order = table[keep:][::-1]
            del table[keep:]
            self.pool.free_blocks(order)
        self.cached[rid] = min(self.cached[rid], len(table))

    def free(self, rid: str) -> None:
        """Release every owned entry, tail first."""
        owned = self.owned(rid)
        self.tables.pop(rid, None)
        self.released.pop(rid, None)
        self.cached.pop(rid, None)
        if owned:
            self.pool.free_blocks(owned[::-1])

    def check_invariants(self, tables: dict[str, list[int]] | None = None) -> None:
        """Raise AssertionError unless ref counts match the owned entries (and, given the coordinator's
        live tables, every local table is as long as its global one)."""
        for rid, table in (tables or {}).items():
            if len(self.tables.get(rid, ())) != len(table):
                raise AssertionError(f"request {rid!r}: local table length != global table length")
        self.pool.check_invariants()
        holders = [0] * self.pool.num_blocks
        for rid in self.tables:
            owned = self.owned(rid)
            if len(set(owned)) != len(owned):
                raise AssertionError(f"request {rid!r} holds a local block twice: {owned}")
            for b in owned:
                holders[b] += 1
        for blk in self.pool.blocks:
            if blk.ref_cnt != holders[blk.block_id]:
                raise AssertionError(f"local {blk}: ref_cnt != {holders[blk.block_id]} live holders")


def split_blocks(num_blocks: int, num_global_layers: int, num_local_layers: int, window: int, block_size: int,
                 max_num_seqs: int, chunk_tokens: int) -> tuple[int, int]:
    """(global blocks, local blocks) in the memory of ``num_blocks`` blocks of every layer, once the local
    layers have their own tables: the local pool holds every running request's window (+ 2 blocks of
    slack each) plus one step's chunk, at most ``num_blocks``; the global layers get the rest."""
    if num_global_layers <= 0 or num_local_layers <= 0:
        return num_blocks, num_blocks
    per_seq = -(-window // block_size) + 2
    local = min(num_blocks, max_num_seqs * per_seq + -(-chunk_tokens // block_size))
    layers = num_global_layers + num_local_layers
    return (num_blocks * layers - num_local_layers * local) // num_global_layers, local
