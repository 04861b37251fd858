"""Prefill pacing (hitenter/engine/fresh_lane.py): a long prompt beside decoding streams advances in chunks
sized so a step costs about two decode steps, learnt from the steps' times; the same outputs whatever the
chunks, against the mock runner of test_scheduler."""

from __future__ import annotations

from test_fresh_lane import make, timed_step
from test_scheduler import req

from hitenter.engine.fresh_lane import MIN_PROMPT_CHUNK, NO_CAP, FreshLane


def test_cap_learnt_from_decode_and_mixed_steps() -> None:
    lane = FreshLane(4)
    assert lane.prompt_cap == NO_CAP                        # nothing measured: no cap
    lane.record(False, 0.010, prompt_tokens=0, decoding=True)
    lane.record(False, 0.200, prompt_tokens=400, decoding=False)   # a prompt token: 0.5 ms
    assert lane.prompt_cap == MIN_PROMPT_CHUNK              # 10 ms / 0.5 ms = 20, raised to the floor
    lane.record(False, 0.110, prompt_tokens=1000, decoding=True)   # the prompt part cost 100 ms
    assert lane.prompt_cap == 100                           # 1000 tokens x 10 ms / 100 ms
    lane.record(False, 0.015, prompt_tokens=100, decoding=True)    # cheaper than aimed: grows, at most 2x
    assert lane.prompt_cap == 200
    lane.record(False, 10.0, prompt_tokens=200, decoding=True)     # far too slow: shrinks to the floor
    assert lane.prompt_cap == MIN_PROMPT_CHUNK


def test_long_prompt_beside_streams_is_chunked_and_not_fresh() -> None:
    s, run = make(fresh=4, num_blocks=256, max_batched=512)
    s.add_request(req("stream", [1, 2, 3], max_tokens=200))
    for _ in range(3):
        timed_step(s, run, 0.010)                           # decode steps of the stream alone: 10 ms
    s.lane.record(False, 0.100, prompt_tokens=200, decoding=False)   # a prompt token: 0.5 ms
    cap = s.lane.prompt_cap
    assert cap == MIN_PROMPT_CHUNK
    s.add_request(req("long", list(range(10, 410)), max_tokens=3))
    out = timed_step(s, run, 0.020)
    assert out == ["stream", "long"]                        # beside the stream, not in a lane step alone
    long = s.get_request("long")
    assert long.num_computed_tokens == cap                   # one chunk of the cap
    without = 0
    while long.num_output_tokens == 0:
        before, cap = long.num_computed_tokens, s.lane.prompt_cap
        ran = timed_step(s, run, 0.020)
        assert long.num_computed_tokens - before <= cap       # never more than the cap in one step
        without = 0 if "stream" in ran else without + 1
        assert without <= 1   # the stream sits out at most one lane step (the prompt's last chunk, fresh now)
    assert s.get_request("stream").num_output_tokens > 3
