"""The recurrent-state group: live slots per running request, snapshots keyed by the block-hash chain,
prefix hits cut back to the deepest snapshot, all-or-nothing admission, and slot accounting under random
operations (kv_cache/state_group.py through KVCacheManager)."""

from __future__ import annotations

import random

import pytest

from hitenter.kv_cache.manager import KVCacheManager
from hitenter.kv_cache.state_group import ZERO, StateGroup
from hitenter.request import Request

BS = 4


def req(rid: str, prompt: list[int], max_tokens: int = 100) -> Request:
    return Request(rid, list(prompt), None, max_tokens)  # type: ignore[arg-type]


def step(m: KVCacheManager, r: Request, n: int, hits: list[int] | None = None):  # noqa: ANN201
    """One scheduler step of n rows: allocate, plan the state, 'compute', cache what is verified."""
    assert m.allocate_slots(r, n, hits) is not None
    plan = m.state_step(r, n)
    r.num_computed_tokens += n
    m.cache_blocks(r, min(r.num_computed_tokens, r.num_tokens))
    return plan


def prefill(m: KVCacheManager, r: Request):  # noqa: ANN201
    hits, n = m.get_computed_blocks(r)
    r.num_computed_tokens = n
    return step(m, r, r.num_tokens - n, hits), n


def test_first_step_zeroes_the_live_slot_and_saves_at_the_prompt_end() -> None:
    m = KVCacheManager(32, BS, num_state_slots=8)
    r = req("a", list(range(10)))
    plan, hit = prefill(m, r)
    assert hit == 0 and plan.restore == ZERO
    # the prompt's last block boundary (8) inside rows [0, 10): the state after row 7 is saved
    assert [rows for rows, _ in plan.saves] == [8]
    assert m.state.num_snapshots == 1
    m.check_invariants()


def test_a_second_turn_resumes_from_the_deepest_snapshot() -> None:
    m = KVCacheManager(64, BS, num_state_slots=8)
    a = req("a", list(range(10)))
    prefill(m, a)
    # the reply: 7 generated tokens, each a one-row step; boundaries 12 and 16 are reply boundaries
    for t in range(7):
        a.output_token_ids.append(100 + t)
        step(m, a, 1)
    m.free(a)
    # turn 2 = turn 1's prompt + reply + new tokens: resumes at 16 (the newest reply boundary)
    b = req("b", list(range(10)) + [100 + t for t in range(7)] + [7, 7, 7, 7, 7])
    plan, hit = prefill(m, b)
    assert hit == 16
    assert plan.restore not in (None, ZERO)
    m.check_invariants()


def test_a_hit_without_a_state_snapshot_is_cut_back() -> None:
    m = KVCacheManager(64, BS, num_state_slots=8)
    a = req("a", list(range(21)))
    prefill(m, a)                          # snapshot only at 20 (the prompt end's boundary)
    m.free(a)
    b = req("b", list(range(13)) + [99] * 8)   # shares 3 whole blocks (12 tokens) with a
    hits, n = m.get_computed_blocks(b)
    assert n == 0 and hits == []           # the KV blocks are cached, but no state at 12: start over
    c = req("c", list(range(21)) + [5, 5])
    hits, n = m.get_computed_blocks(c)
    assert n == 20


def test_an_edited_earlier_message_resumes_before_the_edit() -> None:
    m = KVCacheManager(128, BS, num_state_slots=16)
    m.state.interval = 2                    # a periodic snapshot every 2 blocks (8 tokens)
    a = req("a", list(range(30)))
    prefill(m, a)                          # snapshots at 8, 16, 24 and 28
    m.free(a)
    edited = list(range(30))
    edited[18] = 999                       # an edit inside block 4
    b = req("b", edited + [1, 2])
    hits, n = m.get_computed_blocks(b)
    assert n == 16


def test_admission_is_all_or_nothing_when_no_slot_is_free() -> None:
    m = KVCacheManager(64, BS, num_state_slots=2, enable_prefix_caching=False)
    a, b, c = req("a", [1] * 5), req("b", [2] * 5), req("c", [3] * 5)
    assert m.allocate_slots(a, 5) is not None and m.allocate_slots(b, 5) is not None
    free_blocks = m.num_free_blocks
    assert m.allocate_slots(c, 5) is None
    assert m.num_free_blocks == free_blocks and m.block_table("c") == []
    m.free(a)
    assert m.allocate_slots(c, 5) is not None
    m.check_invariants()


def test_snapshots_are_evicted_for_live_slots_least_recent_first() -> None:
    m = KVCacheManager(128, BS, num_state_slots=4)   # each prefill: a live slot + its prompt-end snapshot
    for i in range(3):
        r = req(f"r{i}", [i] * 9)
        prefill(m, r)
        m.free(r)
    assert m.state.num_snapshots == 3
    live = [req(f"l{i}", [50 + i] * 3) for i in range(4)]
    for r in live:
        assert m.allocate_slots(r, 3) is not None
    assert m.state.num_snapshots == 0      # every snapshot gave its slot to a running request
    assert m.allocate_slots(req("x", [7] * 3), 3) is None
    m.check_invariants()


def test_a_restored_snapshot_is_pinned_until_its_step_ran() -> None:
    g = StateGroup(2, BS)
    g._by_hash[b"h"] = 0
    g._hash_of[0] = b"h"
    g._lru[0] = None
    g._free = [1]
    assert g.admit("a", b"h")              # takes slot 1, pins snapshot 0
    assert not g.admit("b", None)          # the pinned snapshot cannot be evicted for b
    g.commit("a", [], 0, 10)
    g.check_invariants()
    assert g.admit("b", None)              # unpinned now: evicted for b
    g.check_invariants()


def test_preemption_releases_the_slot_and_planned_saves() -> None:
    m = KVCacheManager(64, BS, num_state_slots=6)
    r = req("a", list(range(12)))
    assert m.allocate_slots(r, 12) is not None
    plan = m.state_step(r, 12)
    assert plan.saves                      # planned, not yet committed
    m.free(r)                              # preempted (or aborted) before the step's results
    assert m.state.num_free_slots == 6
    m.check_invariants()


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_every_slot_accounted_for(seed: int) -> None:
    rng = random.Random(seed)
    m = KVCacheManager(48, BS, num_state_slots=6)
    live: dict[str, Request] = {}
    for i in range(300):
        op = rng.random()
        if op < 0.4 and len(live) < 5:
            base = [rng.randrange(3) for _ in range(rng.randrange(1, 20))]
            r = req(f"r{i}", base)
            hits, n = m.get_computed_blocks(r)
            if m.allocate_slots(r, r.num_tokens - n, hits) is None:
                continue
            r.num_computed_tokens = n
            m.state_step(r, r.num_tokens - n)
            r.num_computed_tokens = r.num_tokens
            m.cache_blocks(r, r.num_tokens)
            live[r.request_id] = r
        elif op < 0.8 and live:
            r = live[rng.choice(sorted(live))]
            r.output_token_ids.append(rng.randrange(3))
            if m.allocate_slots(r, 1) is None:
                m.free(r)
                del live[r.request_id]
                continue
            m.state_step(r, 1)
            r.num_computed_tokens += 1
            m.cache_blocks(r, r.num_tokens)
        elif live:
            m.free(live.pop(rng.choice(sorted(live))))
        m.check_invariants()
    for r in live.values():
        m.free(r)
    m.check_invariants()
    assert m.state.num_free_slots == 6


def test_a_verification_keeps_the_state_at_the_accepted_position() -> None:
    m = KVCacheManager(64, BS, num_state_slots=12)
    r = req("a", list(range(6)))
    prefill(m, r)
    r.output_token_ids.append(50)                 # the sampled token, then 3 drafts scored in one pass
    r.spec_token_ids = [51, 52, 53]
    assert m.allocate_slots(r, 4) is not None
    plan = m.state_step(r, 4)
    # after the verified token, after draft 1, after draft 2; and the reply's block boundary (8) at row 2
    assert sorted(rows for rows, _ in plan.saves) == [1, 2, 2, 3]
    # one draft accepted: the model's own next token replaces draft 2, so the verified tokens end at 8
    r.spec_token_ids = []
    r.output_token_ids += [51, 60]
    r.num_computed_tokens = 8
    m.cache_blocks(r, 8)
    nxt = m.state_step(r, 1)                      # the next step restores the state after row 2 (position 8)
    assert nxt.restore in {dst for rows, dst in plan.saves if rows == 2}
    assert m.state.num_snapshots == 2             # the prompt-end one and the reply boundary at 8
    r.num_computed_tokens += 1
    m.cache_blocks(r, 9)
    m.check_invariants()
    m.free(r)
    m.check_invariants()
    assert m.state.num_free_slots == 12
