"""StateGroup: the recurrent-state slots of a hybrid model's recurrent layers, and their snapshots.

A recurrent layer (Gated DeltaNet, Mamba2, a gated short convolution) keeps one fixed-size state per
sequence instead of a growing KV cache. The model's state tensors hold ``num_slots`` slots each
(``[num_slots, ...]`` per layer); this group decides which slot is whose. It is llama.cpp's
``llama_memory_recurrent`` and vLLM's mamba cache group in spirit, with one difference: a state cannot be
cut back to an earlier position, so the group keeps *snapshots* -- copies of a state at a block boundary --
keyed by the block-hash chain of the prefix cache. A request whose tokens extend a snapshotted prefix
resumes from the deepest snapshot instead of position 0.

Contracts:
- A running request owns exactly one *live* slot from its first allocation until ``free``.
- ``hit_depth(hashes)``: the deepest prefix (in blocks) of the given hash chain that has a snapshot; a prefix
  hit of the other groups is cut back to it (0: no snapshot, the state starts from zero).
- ``admit(rid, hit_hash)`` takes a live slot (evicting an unused snapshot when none is free; None when
  nothing can be freed) and records the step's restore: copy the snapshot of ``hit_hash``, or zero the slot
  (hit_hash None). The snapshot is pinned until the step that reads it has run (``commit``).
- ``plan(rid, start, n, prompt_len)``: the step's ``StateStep`` -- the live slot, the restore (once), and the
  saves: block boundaries ``p`` in ``(start, start + n]`` where the state after row ``p - 1`` is copied to a
  fresh slot. Saves are taken at the last block boundary before the prompt's last row (a request with the
  same prompt then recomputes that row on the same path), at every ``interval`` blocks, and at each
  block boundary of the reply (only the newest reply snapshot is kept, so the next chat turn resumes at the
  reply's last boundary). A save that finds no free slot is skipped (snapshots are a cache).
- ``commit(rid, hashes, num_verified)`` (after the step ran): registers each planned save at ``p <=
  num_verified`` under ``hashes[p // bs - 1]`` (an equal hash already registered keeps the old slot), frees the
  others, unpins the restored snapshot.
- Speculative verification (``drafts`` > 0 in ``plan``): the state after each row that may end the
  accepted run is saved to a scratch slot; ``commit`` keeps the one at the verified position as the next
  step's restore (the live slot holds the state after the last draft) and frees the others, so a rejected
  draft never reaches the state, conv tail included.
- ``free(rid)`` releases the live slot and any planned saves. Unreferenced snapshots are evicted least
  recently used first. ``check_invariants`` verifies that every slot is exactly one of: free, live, pending,
  or a snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hitenter.kv_cache.cache_group import CacheGroup, Chunk
from hitenter.kv_cache.hashing import BlockHash

ZERO = -1   # restore source meaning "start from a zero state"


@dataclass
class StateStep:
    """What the runner does with a request's recurrent state in one step (see the module docstring)."""

    slot: int                          # the live slot the recurrent layers read and write
    restore: int | None = None         # before the step: copy this slot into ``slot`` (ZERO: zero it)
    saves: list[tuple[int, int]] = field(default_factory=list)   # (rows of this step done, destination slot)


class StateGroup(CacheGroup):
    """Slots for live states and prefix snapshots; ``interval`` blocks between periodic snapshots."""

    def __init__(self, num_slots: int, block_size: int, interval: int = 32) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots: must be >= 1, got {num_slots}")
        self.num_slots, self.block_size, self.interval = num_slots, block_size, max(interval, 1)
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self.live: dict[str, int] = {}
        self._restore: dict[str, int] = {}                       # rid -> source slot (or ZERO), taken by plan
        self._pending: dict[str, list[tuple[int, int]]] = {}      # rid -> [(position p, slot)] saved, unregistered
        self._scratch: dict[str, list[tuple[int, int]]] = {}      # rid -> [(position, slot)] of a verification
        self._rollback: dict[str, int] = {}                       # rid -> scratch slot its next step restores
        self._pins: dict[str, int] = {}                           # rid -> snapshot slot pinned by its restore
        self._reply: dict[str, BlockHash] = {}                    # rid -> the hash of its newest reply snapshot
        self._by_hash: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()        # unpinned snapshots, least recent first
        self._pin_count: dict[int, int] = {}

    # ---- counts ------------------------------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        """Slots that admission can take: free ones plus unpinned snapshots (which are evicted on demand)."""
        return len(self._free) + len(self._lru)

    @property
    def num_snapshots(self) -> int:
        return len(self._by_hash)

    def snapshot_hashes(self) -> list[BlockHash]:
        return list(self._by_hash)

    # ---- slots -------------------------------------------------------------------------------------------
    def _take(self) -> int | None:
        if self._free:
            return self._free.pop()
        if not self._lru:
            return None
        slot, _ = self._lru.popitem(last=False)
        del self._by_hash[self._hash_of.pop(slot)]
        return slot

    def _release(self, slot: int) -> None:
        self._free.append(slot)

    def _drop_snapshot(self, slot: int) -> None:
        """A registered, unpinned snapshot leaves the cache (its slot becomes free)."""
        if slot in self._lru:
            del self._lru[slot]
            del self._by_hash[self._hash_of.pop(slot)]
            self._release(slot)

    # ---- lookups -----------------------------------------------------------------------------------------
    def hit_depth(self, hashes: list[BlockHash]) -> int:
        """The most leading blocks of ``hashes`` whose end has a snapshot (0 when none does)."""
        for k in range(len(hashes), 0, -1):
            if hashes[k - 1] in self._by_hash:
                return k
        return 0

    # ---- the coordinator's calls (cache_group.py) ------------------------------------------------------
    def cut_hit(self, hashes: list[BlockHash], chunk: Chunk) -> int:
        return self.hit_depth(hashes)

    def fits(self, rid: str, total_blocks: int, hashes: list[BlockHash], chunk: Chunk, num_computed: int) -> bool:
        if rid in self.live:
            return True
        src = self._by_hash.get(hashes[-1]) if hashes else None
        return len(self._free) + len(self._lru) - (src in self._lru) >= 1   # the restored snapshot stays

    def allocate(self, rid: str, total_blocks: int, hashes: list[BlockHash], chunk: Chunk,
                 num_computed: int) -> None:
        if not self.admit(rid, hashes[-1] if hashes else None):
            raise RuntimeError(f"request {rid!r}: no state slot although fits() said so")

    def verified(self, rid: str, hashes: list[BlockHash], chunk: Chunk, num_verified: int, num_prompt: int) -> None:
        self.commit(rid, hashes, num_verified, num_prompt)

    @property
    def usage(self) -> float:
        return len(self.live) / self.num_slots

    # ---- slots of a request ------------------------------------------------------------------------------
    def admit(self, rid: str, hit_hash: BlockHash | None) -> bool:
        """Give ``rid`` its live slot (no-op when it has one); False when no slot can be had (no change)."""
        if rid in self.live:
            return True
        src = ZERO
        if hit_hash is not None:
            src = self._by_hash.get(hit_hash, ZERO)
            if src == ZERO:
                raise ValueError(f"request {rid!r}: no snapshot for its prefix hit")
            self._pin(src)   # before _take, so the snapshot it restores cannot be the one evicted
        slot = self._take()
        if slot is None:
            if src != ZERO:
                self._unpin(src)
            return False
        self.live[rid] = slot
        self._restore[rid] = src
        if src != ZERO:
            self._pins[rid] = src
        return True

    def _pin(self, slot: int) -> None:
        self._pin_count[slot] = self._pin_count.get(slot, 0) + 1
        self._lru.pop(slot, None)

    def _unpin(self, slot: int) -> None:
        """One pin fewer; the last one returns the snapshot to the LRU (a pinned snapshot is never dropped)."""
        n = self._pin_count.pop(slot) - 1
        if n:
            self._pin_count[slot] = n
        else:
            self._lru[slot] = None   # most recently used

    def plan(self, rid: str, start: int, n: int, prompt_len: int, caching: bool = True, drafts: int = 0) -> StateStep:
        """The step's state work for rows ``[start, start + n)`` of ``rid`` (which must be admitted); the last
        ``drafts`` rows are speculative."""
        step = StateStep(self.live[rid], self._restore.pop(rid, None))
        for r in range(n - drafts, n):   # the state after each row a verification may stop at
            slot = self._take()
            if slot is None:
                raise RuntimeError("no state slot for a speculative verification (slots are sized for them)")
            step.saves.append((r, slot))
            self._scratch.setdefault(rid, []).append((start + r, slot))
        if not caching:
            return step
        bs = self.block_size
        prompt_end = (prompt_len - 1) // bs * bs   # before the last prompt row, which takes the generation path
        for p in range((start // bs + 1) * bs, start + n + 1, bs):
            if not (p == prompt_end or p % (self.interval * bs) == 0 or p > prompt_len):
                continue
            slot = self._take()
            if slot is None:
                break
            step.saves.append((p - start, slot))
            self._pending.setdefault(rid, []).append((p, slot))
        return step

    def commit(self, rid: str, hashes: list[BlockHash], num_verified: int, prompt_len: int) -> None:
        """After the step: register the planned saves that verified tokens cover, free the rest, unpin."""
        pin = self._pins.pop(rid, None)
        if pin is not None:
            self._unpin(pin)
        old_rollback = self._rollback.pop(rid, None)   # restored by the step that just ran
        if old_rollback is not None:
            self._release(old_rollback)
        for p, slot in self._scratch.pop(rid, ()):
            if p == num_verified:   # the accepted run ended here: the next step restores this state
                self._rollback[rid] = slot
                self._restore[rid] = slot
            else:
                self._release(slot)
        for p, slot in self._pending.pop(rid, ()):
            k = p // self.block_size
            if p > num_verified or k > len(hashes) or hashes[k - 1] in self._by_hash:
                self._release(slot)
                continue
            self._by_hash[hashes[k - 1]] = slot
            self._hash_of[slot] = hashes[k - 1]
            self._lru[slot] = None
            if p > prompt_len:   # a reply snapshot: only the newest one is kept
                old = self._by_hash.get(self._reply.pop(rid, b""))
                if old is not None:
                    self._drop_snapshot(old)
                self._reply[rid] = hashes[k - 1]

    def free(self, rid: str) -> None:
        """Release the live slot, the planned saves and the pin of ``rid`` (a no-op for unknown ids)."""
        slot = self.live.pop(rid, None)
        if slot is not None:
            self._release(slot)
        self._restore.pop(rid, None)
        self._reply.pop(rid, None)
        pin = self._pins.pop(rid, None)
        if pin is not None:
            self._unpin(pin)
        for _, s in self._pending.pop(rid, []) + self._scratch.pop(rid, []):
            self._release(s)
        rollback = self._rollback.pop(rid, None)
        if rollback is not None:
            self._release(rollback)

    def reset(self) -> None:
        """Drop every unpinned snapshot (the prefix cache's reset)."""
        for slot in list(self._lru):
            self._drop_snapshot(slot)

    def check_invariants(self, tables: dict[str, list[int]] | None = None) -> None:
        """Raise AssertionError unless each slot is exactly one of free / live / pending / snapshot (and, given
        the coordinator's live tables, only requests holding blocks hold a live slot)."""
        if tables is not None and set(self.live) - set(tables):
            raise AssertionError("a state slot is held by a request that holds no blocks")
        seen: list[int] = list(self._free) + list(self.live.values())
        seen += [s for saves in (*self._pending.values(), *self._scratch.values()) for _, s in saves]
        seen += list(self._rollback.values())
        seen += list(self._hash_of)
        if sorted(seen) != list(range(self.num_slots)):
            raise AssertionError(f"state slots are not partitioned: {sorted(seen)}")
        if set(self._by_hash.values()) != set(self._hash_of):
            raise AssertionError("snapshot maps disagree")
        if set(self._lru) | set(self._pin_count) != set(self._hash_of) or set(self._lru) & set(self._pin_count):
            raise AssertionError("every snapshot must be either pinned or in the LRU")
