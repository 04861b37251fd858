"""The fresh lane (hitenter/engine/fresh_lane.py): new requests' first tokens in steps of their own,
bounded by the last full step's time; the same outputs and no leaked blocks, against the scheduler's
mock runner (hitenter/testing/mock_runner.py)."""

from __future__ import annotations

import random

import pytest

from hitenter.config import SchedulerConfig
from hitenter.engine.fresh_lane import FreshLane
from hitenter.request import RequestStatus
from hitenter.testing.mock_runner import lane_scheduler as make
from hitenter.testing.mock_runner import random_requests, req, step, timed_step


def test_lane_runs_fresh_requests_alone_within_the_full_steps_time() -> None:
    s, run = make(fresh=3)
    s.add_request(req("old", [1, 2, 3], max_tokens=50))
    for _ in range(4):
        assert timed_step(s, run, 0.020) == ["old"]     # alone: full steps, nothing to put in a lane
    s.add_request(req("new", [4, 5], max_tokens=10))
    # lane steps (prefill + 2 decodes: its first 3 tokens) cost 8 ms each, under the 20 ms full step
    assert [timed_step(s, run, 0.008) for _ in range(3)] == [["new"], ["new"], ["new"]]
    assert s.get_request("new").num_output_tokens == 3          # no longer fresh: one batch again
    assert timed_step(s, run, 0.020) == ["old", "new"]
    s.add_request(req("new2", [6], max_tokens=10))
    assert timed_step(s, run, 0.015) == ["new2"]
    assert timed_step(s, run, 0.006) == ["new2"]                # 15 + 6 > 20 ms: the budget is spent
    assert timed_step(s, run, 0.020) == ["old", "new", "new2"]  # so a full step comes next
    s.add_request(req("new3", [7], max_tokens=10))
    assert timed_step(s, run, 0.004) == ["new3"]                # then the lane again


def test_lane_stays_off_without_timings_drafts_or_an_older_request() -> None:
    lane = FreshLane(4)
    old, new = req("o", [1]), req("n", [2])
    old.output_token_ids.extend([7] * 5)
    assert not lane.lane_only([old], [new])                     # no full step recorded yet
    lane.record(False, 0.02)
    assert lane.lane_only([old], [new]) and lane.lane_only([old, new], [])
    assert not lane.lane_only([new], [])                        # all fresh: that is the full batch
    assert not lane.lane_only([old], [])                        # nothing fresh
    old.spec_token_ids.append(3)
    assert not lane.lane_only([old, new], [])                   # drafts are verified in their step
    assert not FreshLane(0).lane_only([old], [new])
    with pytest.raises(ValueError):
        SchedulerConfig(fresh_tokens=-1)


@pytest.mark.parametrize("seed", [0, 1])
def test_outputs_and_blocks_unchanged_by_the_lane(seed: int) -> None:
    """Random arrivals, step times, aborts and a squeezed cache: the lane changes which step computes a
    token, never the token, and frees every block."""
    results = []
    for fresh in (0, 3):
        s, run = make(fresh, num_blocks=16, max_batched=9, max_seqs=5)
        rng = random.Random(seed)
        pending = sorted(random_requests(seed), key=lambda t: t[0])
        reqs = {r.request_id: r for _, r in pending}
        steps = lanes = 0
        while pending or s.has_unfinished_requests():
            while pending and pending[0][0] <= steps:
                s.add_request(pending.pop(0)[1])
            out, _ = step(s, run)
            s.record_step(out, rng.uniform(0.001, 0.03))
            lanes += out.lane_only
            steps += 1
            assert steps < 5000
        assert s.kv.num_free_blocks == 16 and (lanes > 0) == (fresh > 0)
        assert all(r.status is RequestStatus.FINISHED_LENGTH for r in reqs.values())
        results.append({rid: r.output_token_ids for rid, r in reqs.items()})
    assert results[0] == results[1]
