"""hitenter/engine/cpu_share.py: forwards of one process take turns; pooling keeps to its share of a sliding
window while something generates, runs flat out otherwise, and is never refused. A fake clock drives it."""

from __future__ import annotations

import threading

import pytest

from hitenter.engine.cpu_share import MIN_SLICE_TOKENS, CpuShare


class Engine:
    """An owner (the arbiter holds engines weakly)."""


CHAT, OTHER = Engine(), Engine()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += max(0.0, s)


def _share(share: float = 0.2) -> tuple[CpuShare, Clock]:
    clock = Clock()
    return CpuShare(share, window_s=1.0, clock=clock, sleep=clock.sleep), clock


def _slice(share: CpuShare, clock: Clock, seconds: float, tokens: int | None) -> None:
    with share.pooling_slice(OTHER) as rec:
        clock.t += seconds
        rec.done(tokens)


def test_forwards_never_overlap_and_go_in_arrival_order() -> None:
    share = CpuShare(0.2)
    order, inside, most = [], [0], [0]
    gate = threading.Event()

    def body(name: str) -> None:
        with share.forward(name):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            order.append(name)
            inside[0] -= 1

    threads = []
    with share.forward("holder"):
        for i in range(4):
            t = threading.Thread(target=body, args=(f"e{i}",))
            t.start()
            threads.append(t)
            while share._next_ticket < i + 2:   # e{i} holds its ticket before e{i+1} asks  # noqa: SLF001
                gate.wait(0.001)
        assert order == []                      # all wait for the holder
    for t in threads:
        t.join(10)
    assert order == ["e0", "e1", "e2", "e3"] and most[0] == 1


def test_pooling_runs_flat_out_without_generation() -> None:
    share, clock = _share()
    for _ in range(10):
        assert share.pooling_delay() == 0.0
        _slice(share, clock, 0.5, 512)
    assert share.slice_tokens(512) == 512


def test_pooling_keeps_to_its_share_of_every_window_beside_generation() -> None:
    share, clock = _share(0.2)
    share.set_generating(CHAT, True)
    spans: list[tuple[float, float]] = []
    pooled = 0.0
    while clock.t < 130.0:                      # 30 s of 50 ms generation steps, a pooling slice between them
        clock.t += 0.05
        if share.pooling_delay() == 0.0:
            t0 = clock.t
            _slice(share, clock, 0.08, 80)
            spans.append((t0, clock.t))
            pooled += 0.08
    for _, end in spans:                        # the window ending at each slice's end
        inside = sum(min(b, end) - max(a, end - 1.0) for a, b in spans if b > end - 1.0 and a < end)
        assert inside <= 0.2 + 1e-9
    assert pooled / 30.0 > 0.12                 # and it keeps going: most of its share is used


def test_a_slice_longer_than_the_share_shrinks_and_a_single_long_one_still_runs() -> None:
    share, clock = _share(0.2)
    _slice(share, clock, 0.5, 500)              # 1 ms per token, learnt before generation started
    assert share.slice_tokens(512) == 512       # nothing generates: no shrinking
    share.set_generating(CHAT, True)
    assert share.slice_tokens(512) == 200       # 0.2 s of a 1 s window at 1 ms per token
    assert share.slice_tokens(100) == 100
    _slice(share, clock, 0.6, None)             # one input alone is longer than the share allows
    delay = share.pooling_delay()
    assert 0.0 < delay <= 1.0                   # put off until the window has room, not refused
    clock.sleep(delay)
    assert share.pooling_delay() == 0.0


def test_slices_never_shrink_below_the_floor() -> None:
    share, clock = _share(0.01)
    share.set_generating(CHAT, True)
    _slice(share, clock, 1.0, 100)              # 10 ms per token: 1 token would fit
    assert share.slice_tokens(512) == MIN_SLICE_TOKENS


def test_generation_ends_when_the_engine_says_so() -> None:
    share, clock = _share(0.2)
    share.set_generating(CHAT, True)
    share.set_generating(OTHER, False)
    _slice(share, clock, 0.2, 100)
    assert share.generating() and share.generating(CHAT) and not share.generating(OTHER)
    assert share.pooling_delay() > 0.0
    share.set_generating(CHAT, False)
    assert not share.generating() and share.pooling_delay() == 0.0


def test_share_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="HITENTER_POOLING_SHARE"):
        CpuShare(0.0)
    with pytest.raises(ValueError, match="HITENTER_POOLING_SHARE"):
        CpuShare(1.5)
