"""KVCacheManager: prefix hits (capped, confirmed), allocation all-or-nothing, verified-only caching,
tail-first release, events that replay to the manager's own state, invariants under random ops."""

from __future__ import annotations

import random

from hitenter.kv_cache.events import KVEvent
from hitenter.kv_cache.manager import KVCacheManager
from hitenter.request import Request


def req(rid: str, prompt: list[int], out: list[int] | None = None) -> Request:
    r = Request(rid, list(prompt), None, 100)  # type: ignore[arg-type]
    r.output_token_ids = list(out or [])
    return r


def run_prefill(m: KVCacheManager, r: Request) -> list[int]:
    """Admit like the scheduler: prefix hit, allocate, compute everything, cache verified blocks."""
    hits, n = m.get_computed_blocks(r)
    assert m.allocate_slots(r, r.num_tokens - n, hits) is not None
    r.num_computed_tokens = r.num_tokens
    m.cache_blocks(r, r.num_computed_tokens)
    return hits


def test_alloc_cache_free_events_and_baseline() -> None:
    ev: list[KVEvent] = []
    m = KVCacheManager(8, 4, on_event=ev.append)
    a = req("a", list(range(10)))
    assert m.get_computed_blocks(a) == ([], 0)
    new = m.allocate_slots(a, 10)
    assert new == [0, 1, 2] and m.block_table("a") == [0, 1, 2]
    assert m.num_free_blocks == 5 and m.usage == 3 / 8
    a.num_computed_tokens = 10
    m.cache_blocks(a, 10)                       # 2 full blocks; the partial 3rd is not cached
    assert [e.kind for e in ev] == ["alloc", "cache"]
    assert ev[1].block_ids == (0, 1)
    m.free(a)
    assert ev[-1] == KVEvent("free", "a", (2, 1, 0), (0, 0, 0))
    assert m.num_free_blocks == 8 and m.block_table("a") == []
    m.check_invariants()


def test_prefix_hit_shares_blocks_and_counts_stats() -> None:
    ev: list[KVEvent] = []
    m = KVCacheManager(16, 4, on_event=ev.append)
    a = req("a", list(range(10)))
    run_prefill(m, a)
    b = req("b", list(range(8)) + [99, 98, 97])
    hits, n = m.get_computed_blocks(b)
    assert hits == [0, 1] and n == 8
    assert m.allocate_slots(b, b.num_tokens - n, hits) == [3]
    assert m.block_table("b") == [0, 1, 3]
    share = [e for e in ev if e.kind == "share"][0]
    assert share == KVEvent("share", "b", (0, 1), (2, 2))
    m.check_invariants()
    st = m.prefix_cache_stats
    assert (st.requests, st.queries, st.hits) == (2, 21, 8)
    m.free(a)
    m.free(b)
    assert m.num_free_blocks == 16
    m.check_invariants()


def test_last_token_always_recomputed() -> None:
    m = KVCacheManager(16, 4)
    run_prefill(m, req("a", list(range(8))))
    hits, n = m.get_computed_blocks(req("b", list(range(8))))      # an exact multiple of block_size
    assert n == 4 and len(hits) == 1                                  # one whole block less
    hits, n = m.get_computed_blocks(req("c", list(range(9))))
    assert n == 8 and len(hits) == 2
    assert m.get_computed_blocks(req("d", [0])) == ([], 0)


def test_preempted_request_rehits_its_outputs() -> None:
    m = KVCacheManager(16, 2)
    a = req("a", [1, 2, 3], out=[4, 5, 6])
    run_prefill(m, a)
    m.free(a)
    a.num_computed_tokens = 0
    hits, n = m.get_computed_blocks(a)
    assert n == 4                                  # prompt + outputs, capped below 6


def test_hash_collision_never_hits() -> None:
    m = KVCacheManager(16, 2)
    m.hash_fn = lambda parent, toks: b"\x07" * 16     # every block collides
    run_prefill(m, req("a", [1, 2, 1, 2, 3]))
    assert m.get_computed_blocks(req("b", [5, 6, 7]))[1] == 0            # other tokens: no hit
    # same first block hits; the second has equal tokens but a different parent: no hit
    hits, n = m.get_computed_blocks(req("c", [1, 2, 1, 2, 9]))
    assert n == 2


def test_freed_blocks_hittable_until_reused_tail_evicted_first() -> None:
    ev: list[KVEvent] = []
    m = KVCacheManager(4, 2, on_event=ev.append)
    a = req("a", [1, 2, 3, 4, 5, 6, 7])
    run_prefill(m, a)                                 # blocks 0,1,2 cached, 3 partial
    m.free(a)
    assert m.get_computed_blocks(req("x", [1, 2, 3, 4, 5, 6, 7]))[1] == 6   # hittable while free
    c = req("c", [9])
    assert m.allocate_slots(c, 4) == [3, 2]           # unhashed block 3 first, then a's tail block 2
    assert ev[-2] == KVEvent("evict", "c", (2,), (1,))
    assert m.get_computed_blocks(req("y", [1, 2, 3, 4, 5, 6, 7]))[1] == 4   # head still cached
    m.free(c)
    m.check_invariants()


def test_only_verified_tokens_cached() -> None:
    m = KVCacheManager(8, 2)
    a = req("a", [1, 2, 3, 4, 5, 6])
    assert m.allocate_slots(a, 6) is not None
    m.cache_blocks(a, 3)                              # e.g. drafted tokens beyond 3 not verified yet
    assert m.get_computed_blocks(req("b", [1, 2, 3, 4, 5, 6, 7]))[1] == 2
    m.cache_blocks(a, 6)
    assert m.get_computed_blocks(req("b", [1, 2, 3, 4, 5, 6, 7]))[1] == 6
    m.cache_blocks(a, 6)                              # idempotent
    m.check_invariants()


def test_allocation_is_all_or_nothing() -> None:
    ev: list[KVEvent] = []
    m = KVCacheManager(4, 2, on_event=ev.append)
    a = req("a", [1, 2, 3, 4])
    run_prefill(m, a)                                 # 2 blocks, both cached
    m.free(a)
    b = req("b", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    hits, n = m.get_computed_blocks(b)
    assert n == 4
    n_ev = len(ev)
    assert m.allocate_slots(b, 6, hits) is None        # 2 reclaimed hits + 3 new > 4 free
    assert len(ev) == n_ev and m.num_free_blocks == 4 and m.block_table("b") == []
    assert m.allocate_slots(b, 4, hits) is not None    # 2 hits + 2 new fits
    m.check_invariants()
    m.free(b)
    assert m.num_free_blocks == 4


def test_caching_disabled() -> None:
    m = KVCacheManager(8, 2, enable_prefix_caching=False)
    run_prefill(m, req("a", [1, 2, 3, 4, 5]))
    assert m.get_computed_blocks(req("b", [1, 2, 3, 4, 5])) == ([], 0)
    assert not any(s.hashed for s in m.snapshot())


class Replay:
    """Rebuild the block map from events alone; must equal ``snapshot()``."""

    def __init__(self, n: int) -> None:
        self.ref = [0] * n
        self.owners: list[list[str]] = [[] for _ in range(n)]
        self.hashed = [False] * n

    def __call__(self, e: KVEvent) -> None:
        for b, r in zip(e.block_ids, e.ref_cnts, strict=True):
            if e.kind in ("alloc", "share"):
                self.owners[b].append(e.request_id or "")
            elif e.kind == "free":
                self.owners[b].remove(e.request_id or "")
            elif e.kind == "cache":
                self.hashed[b] = True
            elif e.kind == "evict":
                self.hashed[b] = False
            self.ref[b] = r

    def check(self, m: KVCacheManager) -> None:
        for s in m.snapshot():
            assert s.ref_cnt == self.ref[s.block_id] == len(s.owners)
            assert sorted(s.owners) == sorted(self.owners[s.block_id])
            assert s.hashed == self.hashed[s.block_id]
            assert s.free == (s.ref_cnt == 0)


def test_random_alloc_free_abort_sequences() -> None:
    for seed in range(6):
        rng = random.Random(seed)
        m = KVCacheManager(24, 4)
        rep = Replay(24)
        m.on_event = rep
        prefixes = [[rng.randrange(50) for _ in range(rng.randint(0, 12))] for _ in range(3)]
        live: dict[str, Request] = {}
        for step in range(400):
            op = rng.random()
            if op < 0.3:                              # a new request, maybe with a shared prefix
                r = req(f"r{step}", rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 10))])
                hits, n = m.get_computed_blocks(r)
                assert n % 4 == 0 and n <= r.num_tokens - 1
                chunk = rng.randint(1, r.num_tokens - n)
                if m.allocate_slots(r, chunk, hits) is not None:
                    r.num_computed_tokens = n + chunk
                    m.cache_blocks(r, r.num_computed_tokens)
                    live[r.request_id] = r
            elif op < 0.75 and live:                  # advance: finish the prefill or decode a token
                r = rng.choice(list(live.values()))
                if r.num_computed_tokens == r.num_tokens:
                    r.output_token_ids.append(rng.randrange(50))
                k = r.num_tokens - r.num_computed_tokens
                if m.allocate_slots(r, k) is not None:
                    r.num_computed_tokens += k
                    m.cache_blocks(r, r.num_computed_tokens)
            elif live:                                # finish or abort
                r = live.pop(rng.choice(list(live)))
                m.free(r)
            m.check_invariants()
            rep.check(m)
            tables = [m.block_table(rid) for rid in live]
            for r in live.values():
                assert len(m.block_table(r.request_id)) * 4 >= r.num_computed_tokens
            assert m.num_free_blocks == 24 - len({b for t in tables for b in t})
        for r in list(live.values()):
            m.free(r)
        m.check_invariants()
        rep.check(m)
        assert m.num_free_blocks == 24 and m.usage == 0.0
