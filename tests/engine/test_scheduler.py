"""Scheduler against a mock model runner that stores fake K/V through the block tables.

The mock writes (token, position) into a slot per new token and, for each caught-up request, reads
the whole context back through the block table; its "sampled" token is a hash of what it read. So a
wrong block table, a bad prefix hit or a lost token after preemption changes the outputs.
"""

from __future__ import annotations

import random

import pytest

from hitenter.config import SchedulerConfig
from hitenter.engine.scheduler import Scheduler
from hitenter.errors import ContextOverflowError, QueueFullError
from hitenter.kv_cache.manager import KVCacheManager
from hitenter.request import RequestStatus
from hitenter.testing.mock_runner import MockRunner, random_requests, req, step


def make(num_blocks: int = 64, block_size: int = 4, max_batched: int = 64, max_seqs: int = 8,
         max_queued: int | None = None) -> tuple[Scheduler, KVCacheManager]:
    kv = KVCacheManager(num_blocks, block_size)
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_batched, max_model_len=4096,
                          max_queued_requests=max_queued)
    return Scheduler(cfg, kv), kv


def test_prefill_and_decode_mix_in_one_batch() -> None:
    s, kv = make()
    run = MockRunner(kv)
    s.add_request(req("a", [1, 2, 3, 4, 5]))
    out, sampled = step(s, run)
    assert [(x.request.request_id, x.num_computed_tokens, x.num_new_tokens) for x in out.scheduled] == [("a", 0, 5)]
    assert list(sampled) == ["a"] and s.get_request("a").metrics.first_scheduled_time is not None
    s.add_request(req("b", [7] * 7))
    out, sampled = step(s, run)
    assert [(x.request.request_id, x.num_computed_tokens, x.num_new_tokens) for x in out.scheduled] == [
        ("a", 5, 1), ("b", 0, 7)]
    assert set(sampled) == {"a", "b"} and out.num_batched_tokens == 8


def test_chunked_prefill_behind_running_decodes() -> None:
    s, kv = make(max_batched=4)
    run = MockRunner(kv)
    s.add_request(req("a", [1, 2], max_tokens=10))
    step(s, run)
    s.add_request(req("b", list(range(10))))
    got = []
    for _ in range(4):
        out, sampled = step(s, run)
        got.append([(x.request.request_id, x.num_new_tokens, x.request.request_id in sampled) for x in out.scheduled])
    assert got == [[("a", 1, True), ("b", 3, False)], [("a", 1, True), ("b", 3, False)],
                   [("a", 1, True), ("b", 3, False)], [("a", 1, True), ("b", 1, True)]]
    assert s.get_request("b").num_output_tokens == 1


def test_max_num_seqs_and_fcfs() -> None:
    s, kv = make(max_seqs=2)
    run = MockRunner(kv)
    for i in range(3):
        s.add_request(req(f"r{i}", [i + 1] * 3, max_tokens=2))
    out, _ = step(s, run)
    assert [x.request.request_id for x in out.scheduled] == ["r0", "r1"] and s.num_waiting == 1
    out, _ = step(s, run)          # r0, r1 finish (max_tokens=2) at the end of this step
    assert [x.request.request_id for x in out.scheduled] == ["r0", "r1"]
    out, _ = step(s, run)
    assert [x.request.request_id for x in out.scheduled] == ["r2"]


def test_waiting_head_that_does_not_fit_blocks_later_requests() -> None:
    s, kv = make(num_blocks=6, block_size=4)
    run = MockRunner(kv)
    s.add_request(req("a", [1] * 12, max_tokens=4))   # 3 blocks, up to 4 with decodes
    step(s, run)
    s.add_request(req("big", [2] * 16, max_tokens=4))  # needs 4 blocks; only 2-3 free
    s.add_request(req("small", [3], max_tokens=1))     # would fit, but must not jump ahead
    out, _ = step(s, run)
    assert [x.request.request_id for x in out.scheduled] == ["a"]
    assert [r.request_id for r in s.waiting] == ["big", "small"]
    while s.has_unfinished_requests():
        step(s, run)
    assert kv.num_free_blocks == 6


def test_prefix_hit_advances_num_computed_tokens() -> None:
    s, kv = make(block_size=4)
    run = MockRunner(kv)
    s.add_request(req("a", list(range(12)), max_tokens=1))
    step(s, run)
    assert s.get_request("a") is None                  # finished, blocks freed but still cached
    s.add_request(req("b", list(range(8)) + [30, 31, 32]))
    out, _ = step(s, run)
    [x] = out.scheduled
    assert (x.num_computed_tokens, x.num_new_tokens) == (8, 3)
    assert x.request.num_cached_tokens == 8
    assert [e.kind for e in out.kv_events if e.request_id == "b"] == ["share", "alloc"]
    s.add_request(req("c", list(range(12))))          # exact multiple: last block recomputed
    out, _ = step(s, run)
    assert [(y.num_computed_tokens, y.num_new_tokens) for y in out.scheduled if y.request.request_id == "c"] == [(8, 4)]
    assert s.stats.prefix_cache_hits == 16


def test_preemption_newest_first_and_recovery() -> None:
    s, kv = make(num_blocks=4, block_size=2, max_batched=64)
    run = MockRunner(kv)
    s.add_request(req("old", [1, 2, 3, 4], max_tokens=4))   # 2 full blocks now, 4 in the end
    s.add_request(req("new", [4, 5, 6, 7], max_tokens=4))
    step(s, run)
    assert kv.num_free_blocks == 0
    out, _ = step(s, run)                              # both need a 3rd block: "new" is preempted
    assert [r.request_id for r in out.preempted] == ["new"]
    assert [x.request.request_id for x in out.scheduled] == ["old"]
    new = s.get_request("new")
    assert new.status is RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert new.metrics.num_preemptions == 1 and new.num_output_tokens == 1 and s.waiting[0] is new
    assert s.stats.num_preemptions == 1
    while s.has_unfinished_requests():
        step(s, run)
    assert kv.num_free_blocks == 4 and new.num_output_tokens == 4 and new.status is RequestStatus.FINISHED_LENGTH


def test_abort_frees_waiting_and_running() -> None:
    s, kv = make(num_blocks=8, max_seqs=1)
    run = MockRunner(kv)
    s.add_request(req("a", [1] * 9, max_tokens=8))
    s.add_request(req("b", [2] * 3))
    step(s, run)
    assert kv.num_free_blocks == 5
    s.finish_request("b", RequestStatus.FINISHED_ABORTED)
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)     # twice: ignored
    assert kv.num_free_blocks == 8 and not s.has_unfinished_requests()
    out = s.schedule()
    assert not out.scheduled and [e.kind for e in out.kv_events] == ["cache", "free"]   # since the last schedule()
    kv.check_invariants()


def test_abort_between_schedule_and_update_is_safe() -> None:
    s, kv = make()
    run = MockRunner(kv)
    s.add_request(req("a", [1, 2, 3]))
    out = s.schedule()
    sampled = run.run(out)
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    s.update(out, sampled)
    assert kv.num_free_blocks == kv.num_blocks and s.get_request("a") is None


def test_queue_limits() -> None:
    s, _ = make(num_blocks=4, block_size=4, max_queued=1)
    s.add_request(req("a", [1]))
    with pytest.raises(QueueFullError):
        s.add_request(req("b", [1]))
    s2, _ = make(num_blocks=4, block_size=4)
    with pytest.raises(ContextOverflowError):
        s2.add_request(req("huge", [1] * 14, max_tokens=3))   # 17 tokens > 16 slots: could never run
    with pytest.raises(ValueError):
        s.add_request(req("a", [1]))


def run_all(seed: int, num_blocks: int, max_batched: int, max_seqs: int) -> tuple[dict[str, list[int]], int]:
    s, kv = make(num_blocks=num_blocks, block_size=4, max_batched=max_batched, max_seqs=max_seqs)
    run = MockRunner(kv)
    pending = sorted(random_requests(seed), key=lambda t: t[0])
    reqs = {r.request_id: r for _, r in pending}
    steps = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0][0] <= steps:
            s.add_request(pending.pop(0)[1])
        step(s, run)
        steps += 1
        assert steps < 5000, "no progress"
    assert kv.num_free_blocks == num_blocks and kv.usage == 0.0
    assert all(r.status is RequestStatus.FINISHED_LENGTH and r.num_output_tokens == r.max_tokens
               for r in reqs.values())
    return {rid: r.output_token_ids for rid, r in reqs.items()}, s.stats.num_preemptions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mock_loop_small_budget_matches_huge_budget(seed: int) -> None:
    ref, p0 = run_all(seed, num_blocks=4096, max_batched=4096, max_seqs=256)
    small, p1 = run_all(seed, num_blocks=14, max_batched=7, max_seqs=5)
    assert p0 == 0 and p1 > 0          # the small run really was squeezed
    assert small == ref


def test_random_aborts_with_preemption_leave_no_blocks() -> None:
    rng = random.Random(7)
    s, kv = make(num_blocks=12, block_size=4, max_batched=9, max_seqs=4)
    run = MockRunner(kv)
    pending = sorted(random_requests(3, n=40), key=lambda t: t[0])
    steps = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0][0] <= steps:
            s.add_request(pending.pop(0)[1])
        if rng.random() < 0.15 and s.requests:
            s.finish_request(rng.choice(sorted(s.requests)), RequestStatus.FINISHED_ABORTED)
            kv.check_invariants()
        step(s, run)
        steps += 1
        assert steps < 5000
    assert kv.num_free_blocks == 12 and not s.requests
