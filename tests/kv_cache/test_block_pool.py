"""BlockPool and hashing: LRU free queue, eviction on reuse, hit confirmation, invariants."""

from __future__ import annotations

import random

import pytest

from hitenter.kv_cache.block_pool import BlockPool
from hitenter.kv_cache.hashing import hash_block_tokens, hash_full_blocks


def test_hash_is_stable_chained_and_full_blocks_only() -> None:
    a = hash_block_tokens(None, [1, 2, 3, 4])
    assert a == hash_block_tokens(None, [1, 2, 3, 4])            # deterministic
    assert len(a) == 16
    assert a != hash_block_tokens(None, [1, 2, 3, 5])
    assert hash_block_tokens(a, [5, 6]) != hash_block_tokens(None, [5, 6])   # parent matters
    hs = hash_full_blocks([1, 2, 3, 4, 5, 6, 7], 2)
    assert len(hs) == 3                                           # the partial tail is not hashed
    assert hs[1] == hash_block_tokens(hash_block_tokens(None, [1, 2]), [3, 4])
    assert hash_full_blocks([1, 2, 3, 4], 2, num_blocks=1) == hs[:1]
    # a known value pins the encoding: the same in every process (no randomized hash())
    assert a.hex() == "5f0d5e2f6efd72da2e5ae58b52ded935"


def test_lru_order_and_free_unhashed_first() -> None:
    pool = BlockPool(6)
    assert pool.num_free_blocks == 6 and pool.usage == 0.0
    a = pool.get_new_blocks(3)
    assert a == [0, 1, 2] and pool.num_free_blocks == 3 and pool.usage == 0.5
    b = pool.get_new_blocks(3)
    pool.cache_full_block(a[0], b"h0" * 8, [1], None)
    pool.cache_full_block(b[0], b"h1" * 8, [2], None)
    pool.free_blocks(reversed(a))          # tail first: 2, 1 (unhashed -> front), 0 (hashed -> back)
    pool.free_blocks(reversed(b))          # 5, 4 unhashed -> front, 3 hashed -> back
    assert list(pool.free_queue) == [4, 5, 1, 2, 0, 3]
    pool.check_invariants()
    evicted: list[int] = []
    got = pool.get_new_blocks(5, evicted)
    assert got == [4, 5, 1, 2, 0] and evicted == [0]
    assert pool.get_cached_block(b"h0" * 8, [1]) is None        # evicted on reuse
    assert pool.get_cached_block(b"h1" * 8, [2]) == 3            # still hittable while free
    pool.check_invariants()


def test_get_new_blocks_too_many_takes_nothing() -> None:
    pool = BlockPool(2)
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)
    assert pool.num_free_blocks == 2


def test_touch_removes_from_free_queue_and_double_free_raises() -> None:
    pool = BlockPool(3)
    [x] = pool.get_new_blocks(1)
    pool.cache_full_block(x, b"k" * 16, [7, 7], None)
    pool.free_blocks([x])
    assert x in pool.free_queue
    pool.touch([x])
    assert x not in pool.free_queue and pool.blocks[x].ref_cnt == 1
    pool.touch([x])
    assert pool.free_blocks([x]) == [1]
    assert pool.free_blocks([x]) == [0]
    with pytest.raises(ValueError):
        pool.free_blocks([x])
    pool.check_invariants()


def test_hit_confirmed_by_token_ids_and_parent() -> None:
    pool = BlockPool(4)
    [x] = pool.get_new_blocks(1)
    h = b"c" * 16
    assert pool.cache_full_block(x, h, [1, 2], None)
    assert pool.get_cached_block(h, [1, 2]) == x
    assert pool.get_cached_block(h, [1, 3]) is None              # simulated collision: no hit
    assert pool.get_cached_block(h, [1, 2], parent_hash=b"p" * 16) is None
    [y] = pool.get_new_blocks(1)
    assert not pool.cache_full_block(y, h, [1, 2], None)         # duplicate hash: not registered
    assert pool.blocks[y].block_hash is None
    pool.check_invariants()


def test_caching_disabled_never_hits() -> None:
    pool = BlockPool(2, enable_caching=False)
    [x] = pool.get_new_blocks(1)
    assert not pool.cache_full_block(x, b"z" * 16, [1], None)
    assert pool.get_cached_block(b"z" * 16, [1]) is None


def test_random_ops_keep_invariants() -> None:
    rng = random.Random(0)
    pool = BlockPool(16)
    owned: list[int] = []   # one entry per reference
    for step in range(3000):
        op = rng.random()
        if op < 0.35 and pool.num_free_blocks:
            new = pool.get_new_blocks(rng.randint(1, pool.num_free_blocks))
            for b in new:
                if rng.random() < 0.5:
                    pool.cache_full_block(b, hash_block_tokens(None, [b, step]), [b, step], None)
            owned += new
        elif op < 0.55:
            cached = [bid for bid in pool.cached.values()]
            if cached:
                b = rng.choice(cached)
                pool.touch([b])
                owned.append(b)
        elif owned:
            k = rng.randint(1, len(owned))
            rng.shuffle(owned)
            pool.free_blocks(owned[:k])
            owned = owned[k:]
        pool.check_invariants()
        assert pool.num_free_blocks == pool.num_blocks - len(set(owned))
    pool.free_blocks(owned)
    assert pool.num_free_blocks == 16
    assert pool.reset_prefix_cache() and not pool.cached
