"""Prefill pacing (hitenter/engine/prefill_pacing.py): a long prompt beside decoding streams advances in
chunks learnt from the steps' times, and the streams are repaid the time each chunk took beyond one
decode step with decode-only steps, so both keep about half; the same outputs whatever the chunks,
against the scheduler's mock runner (hitenter/testing/mock_runner.py)."""

from __future__ import annotations

import math

import pytest

from hitenter.engine.prefill_pacing import (
    CHUNK_STEPS,
    MAX_HOLD,
    MIN_PROMPT_CHUNK,
    NO_CAP,
    STREAM_SHARE,
    PrefillPacer,
)
from hitenter.engine.scheduler import Scheduler, SchedulerOutput, _prefilling
from hitenter.request import RequestStatus
from hitenter.testing.mock_runner import MockRunner, req, step, timed_step
from hitenter.testing.mock_runner import lane_scheduler as make


def test_chunk_learnt_from_decode_and_mixed_steps() -> None:
    p = PrefillPacer()
    assert p.prompt_cap == NO_CAP                            # nothing measured: no cap
    p.record(False, 0.010, prompt_tokens=0, decoding=True)
    p.record(False, 0.200, prompt_tokens=200, decoding=False)   # a prompt token: 1 ms
    assert p.prompt_cap == max(MIN_PROMPT_CHUNK, int(CHUNK_STEPS * 10))
    p.record(False, 0.060, prompt_tokens=1000, decoding=True)   # the prompt part cost 50 ms
    assert p.prompt_cap == round(1000 * CHUNK_STEPS * 0.010 / 0.050)
    p.adapted = 100
    p.record(False, 0.011, prompt_tokens=100, decoding=True)    # far cheaper than aimed: grows, at most 2x
    assert p.prompt_cap == 200
    p.record(False, 10.0, prompt_tokens=200, decoding=True)     # far too slow: shrinks to the floor
    assert p.prompt_cap == MIN_PROMPT_CHUNK


def test_decode_only_steps_repay_a_chunks_time() -> None:
    p = PrefillPacer()
    p.record(False, 0.010, prompt_tokens=0, decoding=True)      # D = 10 ms
    assert not p.holding and p.budget(False) == NO_CAP
    p.record(False, 0.040, prompt_tokens=64, decoding=True)     # P = 30 ms
    owed = STREAM_SHARE / (1 - STREAM_SHARE) * 0.030 - 0.010    # the streams keep STREAM_SHARE of the time
    assert owed > 0.020 and p.owed_s == pytest.approx(owed)
    assert p.holding and p.budget(False) == 0
    assert p.budget(True) == p.prompt_cap > 0                   # a lane step is never held
    for _ in range(math.ceil(owed / 0.010) - 1):
        p.record(False, 0.010, prompt_tokens=0, decoding=True)
        assert p.holding
    p.record(False, 0.010, prompt_tokens=0, decoding=True)
    assert not p.holding and p.budget(False) == p.prompt_cap    # repaid: the next chunk may run
    p.record(False, 0.014, prompt_tokens=64, decoding=True)     # a chunk well under one decode step owes nothing
    assert not p.holding
    p.record(False, 0.040, prompt_tokens=64, decoding=True)
    p.record(True, 0.5, prompt_tokens=0, decoding=True)         # lane steps neither learn nor repay
    assert p.holding and p.decode_s < 0.011
    p.record(False, 0.5, prompt_tokens=10, decoding=False)      # no streams decoding: nothing owed
    assert not p.holding


def test_a_stalled_decode_step_neither_moves_d_nor_repays_its_stall() -> None:
    """Wall times under load have a long tail: D is a median, and a step repays at most 2D."""
    p = PrefillPacer()
    for t in (0.010, 0.011, 0.009, 1.0, 0.010):
        p.record(False, t, prompt_tokens=0, decoding=True)
    assert p.decode_s == pytest.approx(0.010)
    p.record(False, 0.110, prompt_tokens=64, decoding=True)     # P = 100 ms: owes ~103 ms
    owed = p.owed_s
    p.record(False, 2.0, prompt_tokens=0, decoding=True)        # a 2 s stall gave the streams one token
    assert p.owed_s == pytest.approx(owed - 2 * p.decode_s) and p.decode_s < 0.011 and p.holding


def test_a_held_prompt_runs_after_max_hold_decode_steps() -> None:
    p = PrefillPacer()
    p.record(False, 0.010, prompt_tokens=0, decoding=True)
    p.record(False, 100.0, prompt_tokens=64, decoding=True)     # owes ~100 s
    for _ in range(MAX_HOLD):
        assert p.holding
        p.record(False, 0.010, prompt_tokens=0, decoding=True)  # each repays 10 ms of the 100 s
    assert not p.holding and p.budget(False) == p.prompt_cap
    p.record(False, 0.012, prompt_tokens=64, decoding=True)     # the forced chunk: the old debt is forgiven
    assert not p.holding


def test_long_prompt_beside_streams_is_chunked_and_not_fresh() -> None:
    s, run = make(fresh=4, num_blocks=256, max_batched=512)
    s.add_request(req("stream", [1, 2, 3], max_tokens=200))
    for _ in range(4 + 3):   # its first 4 tokens (a young stream, not paced for), then 3 established ones
        timed_step(s, run, 0.010)                           # decode steps of the stream alone: 10 ms
    s.pacer.record(False, 0.100, prompt_tokens=100, decoding=False)   # a prompt token: 1 ms
    cap = s.pacer.prompt_cap
    assert cap == MIN_PROMPT_CHUNK
    s.add_request(req("long", list(range(10, 410)), max_tokens=3))
    out = timed_step(s, run, 0.020)
    assert out == ["stream", "long"]                        # beside the stream, not in a lane step alone
    long = s.get_request("long")
    assert long.num_computed_tokens == cap                   # one chunk of the cap
    without = 0
    while long.num_output_tokens == 0:
        before, cap = long.num_computed_tokens, s.pacer.prompt_cap
        ran = timed_step(s, run, 0.020)
        assert long.num_computed_tokens - before <= cap       # never more than the cap in one step
        without = 0 if "stream" in ran else without + 1
        assert without <= 1   # the stream sits out at most one lane step (the prompt's last chunk, fresh now)
    assert s.get_request("stream").num_output_tokens > 3


FIXED_S, ROW_S, ATTN_S = 0.005, 0.001, 2e-6   # the cost model: per step, per row, per (prompt row x key)


def step_cost(out: SchedulerOutput) -> float:
    """A compute-bound step: fixed work, every row, and each prompt row's attention over its keys."""
    attn = sum(sum(range(sr.num_computed_tokens, sr.num_computed_tokens + sr.num_new_tokens))
               for sr in out.scheduled if _prefilling(sr.request, sr.num_computed_tokens))
    return FIXED_S + ROW_S * out.num_batched_tokens + ATTN_S * attn


def run_timed(s: Scheduler, run: MockRunner, until) -> tuple[float, int]:
    """Step until ``until()``, timing steps by the cost model: (seconds, stream tokens made)."""
    clock, made = 0.0, 0
    while not until():
        out, sampled = step(s, run)
        seconds = step_cost(out)
        s.record_step(out, seconds)
        clock += seconds
        made += sum(1 for rid in sampled if rid.startswith("s"))
    return clock, made


def test_streams_and_a_long_prompt_each_keep_about_half() -> None:
    """8 streams decode while an 800-token prompt arrives, with 32 prompt rows costing ~3 decode steps:
    the streams keep about half their rate and the prompt's first token comes in about twice its time alone
    (a cap that only sized each step at ~2 decode steps left the streams 0.18x here); nothing is lost."""
    a, run_a = make(fresh=4, num_blocks=2048, max_batched=512, max_seqs=16)
    alone_req = req("long", list(range(1000, 1800)), max_tokens=2)
    a.add_request(alone_req)
    alone, _ = run_timed(a, run_a, lambda: alone_req.num_output_tokens > 0)

    s, run = make(fresh=4, num_blocks=2048, max_batched=512, max_seqs=16)
    reqs = [req("warm", list(range(500, 600)), max_tokens=1)]      # a prompt alone: a prompt token's time
    s.add_request(reqs[0])
    run_timed(s, run, lambda: not s.has_unfinished_requests())
    reqs += [req(f"s{i}", [7, i, 9], max_tokens=250) for i in range(8)]
    for r in reqs[1:]:
        s.add_request(r)
    run_timed(s, run, lambda: all(r.num_output_tokens >= 10 for r in reqs[1:]))
    decode_s = s.pacer.decode_s
    assert decode_s > 0.0 and ROW_S * 32 > 2 * decode_s              # 32 prompt rows alone exceed 2 decode steps
    reqs.append(req("long", list(range(1000, 1800)), max_tokens=2))
    s.add_request(reqs[-1])
    clock, made = run_timed(s, run, lambda: reqs[-1].num_output_tokens > 0)
    streams = made / 8 * decode_s / clock                  # their rate beside the prompt / their rate alone
    assert 0.47 <= streams <= 0.65, streams   # STREAM_SHARE, less the last chunk's unpaid debt and lane step
    assert clock <= 2.2 * alone, (clock, alone)
    run_timed(s, run, lambda: not s.has_unfinished_requests())
    assert all(r.status is RequestStatus.FINISHED_LENGTH and r.num_output_tokens == r.max_tokens for r in reqs)
    assert s.kv.num_free_blocks == 2048


def test_a_burst_behind_its_first_prompt_is_not_paced_but_joins_established_streams_paced() -> None:
    """16 short prompts arrive while the first of them runs: the next step takes all the others in full (their
    only running neighbour is a young stream, within its first tokens), so every first token comes within two
    steps; the same burst beside an established stream advances by the pacer's chunks."""
    def burst(established: bool) -> tuple[int, list[int]]:
        s, run = make(fresh=4, num_blocks=1024, max_batched=2048, max_seqs=32)
        s.add_request(req("old", [5, 6, 7], max_tokens=200 if established else 10))
        for _ in range(10):   # the decode step's time learnt (10 ms); a warm-up that ends, or a stream that goes on
            timed_step(s, run, 0.010)
        assert s.pacer.decode_s == 0.010 and s.has_unfinished_requests() is established
        s.pacer.record(False, 0.480, prompt_tokens=48, decoding=False)   # a prompt token: 10 ms, the cap 32
        reqs = [req(f"b{i}", [100 + i] * 48, max_tokens=8) for i in range(16)]
        s.add_request(reqs[0])
        timed_step(s, run, 0.480)
        for r in reqs[1:]:
            s.add_request(r)
        steps = 1
        while any(r.num_output_tokens == 0 for r in reqs):
            out, _ = step(s, run)
            s.record_step(out, 0.010 + 0.010 * sum(sr.num_new_tokens for sr in out.scheduled))
            steps += 1
        return steps, [r.num_output_tokens for r in reqs]

    steps, outputs = burst(established=False)
    assert steps == 2 and outputs == [2] + [1] * 15
    paced_steps, _ = burst(established=True)
    assert paced_steps >= 15 * 48 // MIN_PROMPT_CHUNK   # chunks of the cap (32 tokens), and held steps
