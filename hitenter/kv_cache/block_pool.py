"""BlockPool: every KV block's ref count and hash, the LRU free queue, and the hash -> block map.

Contracts:
- A block is *free* iff ``ref_cnt == 0`` iff it is in the free queue. There is no reserved null
  block: ids ``0..num_blocks-1`` are all usable.
- The free queue is an ``OrderedDict`` (O(1) pop from the front, O(1) removal from the middle when a
  free cached block is hit). The front is evicted first.
- A freed block keeps its hash and stays hittable until it is popped for a new allocation; only then
  is its hash dropped (evicted). Freed blocks without a hash go to the *front* of the queue (nothing
  to lose by reusing them); hashed ones go to the back (least recently used is evicted first).
- A hit is confirmed by comparing the block's token ids and parent hash, so a hash collision can
  never serve the wrong K/V.
- With ``enable_caching=False`` nothing is ever registered and lookups always miss.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from hitenter.kv_cache.hashing import BlockHash


class KVBlock:
    """Metadata of one physical KV block (the K/V themselves live in the runner's tensors)."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "parent_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.parent_hash: BlockHash | None = None
        self.token_ids: tuple[int, ...] | None = None

    def reset_hash(self) -> None:
        self.block_hash = self.parent_hash = self.token_ids = None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


class BlockPool:
    """All blocks of one KV cache. Not thread-safe (the engine loop owns it)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks: must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks: list[KVBlock] = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[BlockHash, int] = {}

    # ---- counts -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref 0 (including cached ones that a new allocation may evict)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by live requests, 0.0..1.0."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    # ---- allocation -----------------------------------------------------------------------
    def get_new_blocks(self, n: int, evicted: list[int] | None = None) -> list[int]:
        """Pop ``n`` blocks from the front of the free queue, set ref 1, drop their hashes.

        Raises ValueError when fewer than ``n`` blocks are free (nothing is taken then). Ids of
        blocks whose cached hash was dropped are appended to ``evicted`` when given.
        """
        if n < 0 or n > len(self.free_queue):
            raise ValueError(f"cannot get {n} blocks: {len(self.free_queue)} free")
        out: list[int] = []
        for _ in range(n):
            bid, _ = self.free_queue.popitem(last=False)
            blk = self.blocks[bid]
            if blk.block_hash is not None:
                if self.cached.get(blk.block_hash) == bid:
                    del self.cached[blk.block_hash]
                blk.reset_hash()
                if evicted is not None:
                    evicted.append(bid)
            blk.ref_cnt = 1
            out.append(bid)
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """ref_cnt += 1 for each block (a prefix hit); a free block leaves the free queue."""
        for bid in block_ids:
            blk = self.blocks[bid]
            if blk.ref_cnt == 0:
                del self.free_queue[bid]
            blk.ref_cnt += 1

    def free_blocks(self, block_ids: Iterable[int]) -> list[int]:
        """ref_cnt -= 1 for each block, given in eviction order (first = evicted first).

        Blocks reaching 0 join the free queue: hashed ones at the back in the given order, unhashed
        ones at the front. Returns the ref counts after the decrement, in input order.
        """
        refs: list[int] = []
        for bid in block_ids:
            blk = self.blocks[bid]
            if blk.ref_cnt <= 0:
                raise ValueError(f"block {bid} freed with ref_cnt {blk.ref_cnt}")
            blk.ref_cnt -= 1
            refs.append(blk.ref_cnt)
            if blk.ref_cnt == 0:
                self.free_queue[bid] = None
                if blk.block_hash is None:
                    self.free_queue.move_to_end(bid, last=False)
        return refs

    # ---- prefix cache -----------------------------------------------------------------------
    def get_cached_block(self, block_hash: BlockHash, token_ids: Sequence[int],
                         parent_hash: BlockHash | None = None) -> int | None:
        """The block registered under ``block_hash`` if its token ids and parent hash match, else None.

        Does not touch the block (the caller does, when it decides to use it).
        """
        if not self.enable_caching:
            return None
        bid = self.cached.get(block_hash)
        if bid is None:
            return None
        blk = self.blocks[bid]
        if blk.token_ids != tuple(token_ids) or blk.parent_hash != parent_hash:
            return None   # a hash collision: never serve someone else's K/V
        return bid

    def cache_full_block(self, block_id: int, block_hash: BlockHash, token_ids: Sequence[int],
                         parent_hash: BlockHash | None) -> bool:
        """Register a full, verified, owned block under ``block_hash``. Returns True if registered.

        Not registered (False) when caching is off or another block already holds this hash (the
        duplicate stays an ordinary unhashed block).
        """
        blk = self.blocks[block_id]
        if blk.ref_cnt <= 0:
            raise ValueError(f"block {block_id} is not owned (ref {blk.ref_cnt})")
        if not self.enable_caching or blk.block_hash is not None or block_hash in self.cached:
            return False
        blk.block_hash, blk.parent_hash, blk.token_ids = block_hash, parent_hash, tuple(token_ids)
        self.cached[block_hash] = block_id
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every hash (e.g. after a weight change). Only when no block is in use; returns success."""
        if len(self.free_queue) != self.num_blocks:
            return False
        for blk in self.blocks:
            blk.reset_hash()
        self.cached.clear()
        return True

    def check_invariants(self) -> None:
        """Raise AssertionError if the pool's own bookkeeping is inconsistent."""
        for blk in self.blocks:
            if blk.ref_cnt < 0:
                raise AssertionError(f"{blk} has a negative ref count")
            if (blk.ref_cnt == 0) != (blk.block_id in self.free_queue):
                raise AssertionError(f"{blk}: free-queue membership does not match ref count")
            if blk.block_hash is not None and self.cached.get(blk.block_hash) != blk.block_id:
                raise AssertionError(f"{blk}: hashed but not registered")
        for h, bid in self.cached.items():
            if self.blocks[bid].block_hash != h:
                raise AssertionError(f"hash map entry for block {bid} does not match its hash")
        if len(self.free_queue) > self.num_blocks:
            raise AssertionError("free queue longer than the pool")
