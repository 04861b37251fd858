"""The process's cores shared between its engines: one forward at a time, and pooling paced beside generation.

Several engines in one process (a server with a chat model and an embedding or reranking model) each run
their own thread; left alone, their forwards overlap and each asks torch for every core. ``CpuShare`` is
the arbiter they all use (``process_share()``; a test builds its own with a fake ``clock`` and ``sleep``):

- ``forward(owner)``: a context held around an engine step's model work (LLMEngine.step) or one pooling
  slice (``pooling_slice``). Holders take turns in arrival order (a FIFO ticket lock), so forwards of
  different engines never overlap and none waits for ever.
- ``set_generating(owner, on)``: an engine says, after each step, whether it has generation requests.
- Pooling work (embedding and rerank slices, run between an engine's steps) is paced while any engine
  generates: over the last ``window_s`` seconds it takes at most ``share`` of the wall time.
  ``pooling_delay()`` is how long the next slice must wait (0: at once; always 0 while nothing
  generates), assuming the slice lasts as long as the last one per token; ``slice_tokens(wanted)``
  shrinks a slice so that one slice alone fits the share (never below ``MIN_SLICE_TOKENS``); a slice
  longer than the share allows still runs, once the window holds no other pooling, so work is never
  refused. ``pooling_slice(owner)`` runs one slice under ``forward`` and records its span; ``done(tokens)``
  on the returned record gives the rate the next estimates use. ``sleep`` is how a caller waits out a
  delay (a test's fake advances its clock).

The share is ``HITENTER_POOLING_SHARE`` (docs/envs.md), read when the arbiter is built.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hitenter import envs

WINDOW_S = 1.0
MIN_SLICE_TOKENS = 32


@dataclass
class SliceRecord:
    """One pooling slice: ``done(tokens)`` says how many tokens it ran (None: unknown)."""

    tokens: int | None = None

    def done(self, tokens: int | None) -> None:
        self.tokens = tokens


class CpuShare:
    def __init__(self, share: float | None = None, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        share = envs.HITENTER_POOLING_SHARE.get() if share is None else share
        if not 0.0 < share <= 1.0:
            raise ValueError(f"HITENTER_POOLING_SHARE: {share} is not in (0, 1]")
        self.share, self.window_s, self.clock, self.sleep = share, window_s, clock, sleep
        self._turn = threading.Condition()
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()
        self._generating: weakref.WeakSet[object] = weakref.WeakSet()
        self._busy: deque[tuple[float, float]] = deque()    # pooling spans while something generated
        self._s_per_token: float | None = None
        self._last_s = 0.0

    # ---- one forward at a time ------------------------------------------------------------------
    @contextmanager
    def forward(self, owner: object) -> Iterator[None]:
        """Hold the cores for one forward (``owner`` is the engine, for the record only)."""
        with self._turn:
            ticket = self._next_ticket
            self._next_ticket += 1
            try:
                self._turn.wait_for(lambda: self._serving == ticket)
            except BaseException:        # interrupted while waiting: give the turn up
                if self._serving == ticket:
                    self._serving += 1
                else:
                    self._abandoned.add(ticket)
                self._advance()
                raise
        try:
            yield
        finally:
            with self._turn:
                self._serving += 1
                self._advance()

    def _advance(self) -> None:     # _turn held
        while self._serving in self._abandoned:
            self._abandoned.remove(self._serving)
            self._serving += 1
        self._turn.notify_all()

    # ---- generation ------------------------------------------------------------------------------
    def set_generating(self, owner: object, on: bool) -> None:
        with self._turn:
            (self._generating.add if on else self._generating.discard)(owner)

    def generating(self, owner: object | None = None) -> bool:
        """Whether any engine (``owner`` given: that engine) has generation requests."""
        with self._turn:
            return owner in self._generating if owner is not None else len(self._generating) > 0

    # ---- pooling pace ----------------------------------------------------------------------------
    def slice_tokens(self, wanted: int) -> int:
        """The tokens of the next pooling slice: ``wanted``, fewer where one slice would exceed the share."""
        if self.share >= 1.0 or self._s_per_token is None or not self.generating():
            return wanted
        fits = int(self.share * self.window_s / max(self._s_per_token, 1e-9))
        return max(1, min(wanted, max(MIN_SLICE_TOKENS, fits)))

    def _expected_s(self, tokens: int | None) -> float:
        est = self._last_s if tokens is None or self._s_per_token is None else tokens * self._s_per_token
        return min(est, self.share * self.window_s)     # a longer slice runs once the window is clear

    def pooling_delay(self, tokens: int | None = None) -> float:
        """Seconds until a pooling slice of ``tokens`` (None: like the last) may start; 0 for at once."""
        if self.share >= 1.0 or not self.generating():
            return 0.0
        now = self.clock()
        start = now - self.window_s
        with self._turn:
            spans = [(max(a, start), b) for a, b in self._busy if b > start]
        excess = sum(b - a for a, b in spans) + self._expected_s(tokens) - self.share * self.window_s
        if excess <= 1e-12:
            return 0.0
        for a, b in spans:          # slide the window's start until `excess` of pooling has left it
            if b - a >= excess:
                return a + excess - start
            excess -= b - a
        return spans[-1][1] - start if spans else 0.0

    @contextmanager
    def pooling_slice(self, owner: object) -> Iterator[SliceRecord]:
        """Run one pooling slice under ``forward(owner)``; its span counts against the share."""
        rec = SliceRecord()
        with self.forward(owner):
            t0 = self.clock()
            try:
                yield rec
            finally:
                self._record(t0, self.clock(), rec.tokens)

    def _record(self, t0: float, t1: float, tokens: int | None) -> None:
        self._last_s = t1 - t0
        if tokens:
            self._s_per_token = (t1 - t0) / tokens
        with self._turn:
            if self._generating:
                self._busy.append((t0, t1))
            while self._busy and self._busy[0][1] <= t1 - self.window_s:
                self._busy.popleft()


_PROCESS: list[CpuShare] = []
_PROCESS_LOCK = threading.Lock()


def process_share() -> CpuShare:
    """The arbiter every engine of this process uses (built on first use)."""
    with _PROCESS_LOCK:
        if not _PROCESS:
            _PROCESS.append(CpuShare())
        return _PROCESS[0]
