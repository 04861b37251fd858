"""Prefill pacing: how many prompt tokens a step may take beside decoding streams, and in which steps.

Why: on a CPU a step is compute-bound, so a long prompt and running streams share the machine's time.
A stream makes one token per step, so while a prompt is prefilled the streams keep ``D / mean step time``
of their rate (``D``: a decode-only step of the same streams), and the prompt gets the rest of the time.
The goal is both halves at once: the streams keep at least half their rate and the prompt's time to its
first token stays within twice its time alone. Capping each step's chunk so the step costs ~2D meets
neither: a small chunk beside the streams already costs well over 2D, and a smaller floor wastes so much
per step that both shares fall (figures: docs/benchmarks.md).

Rule: time is shared by a fixed split, and the chunk is sized for efficiency separately.
- A step that carries prompt rows beside decoding rows costs ``D + P``: ``P``, its prompt part, is the
  step's time less ``D``. The streams got ``D`` of it; they are owed ``w P - D`` more, with
  ``w = STREAM_SHARE / (1 - STREAM_SHARE)``. Decode-only steps repay the debt with their time. A full step
  takes prompt tokens beside decoding streams only when nothing is owed, so the streams keep about
  ``STREAM_SHARE`` of the time and their rate, and the prompt the rest, whatever the chunk size. The last
  repaying step's surplus, and a chunk cheaper than its share, are kept as credit of at most one decode
  step, so whole steps do not round the split in the streams' favour.
  ``STREAM_SHARE`` is a little over half: the prompt's half comes back as more than half its alone speed
  (each chunk's step also carries the streams' rows, which saves a decode step's fixed work), and the
  streams' half has no such gain.
- The chunk aims ``P`` at ``CHUNK_STEPS`` decode steps' time, learnt from the mixed steps' times (at most
  2x growth per step), never under ``MIN_PROMPT_CHUNK`` tokens: a prompt token costs about the same CPU
  in chunks of 32 to 2,048, and clearly more in chunks of 16 or 8. One decode step's worth is the smallest
  chunk that, without holds, gives the prompt its half, and the most chunks (each saving a decode step's fixed work) that do.
- No starvation: after ``MAX_HOLD`` decode-only steps in a row the prompt runs anyway (the debt is
  forgiven), whatever the measured times. Lane steps (fresh_lane.py) neither learn nor repay here; they
  have their own bound. A step without decoding rows clears the debt (there is no one to repay).
Which step computes a row never changes its result (batch invariance), so outputs do not depend on pacing.
Prompts of hitenter/engine/side_prefill.py's size go to the side prefill instead: paced, such a prompt's
small chunks cost more than its alone time in total (attention over a long prefix in small chunks), and
the two shares sum to less than 1.

Contract: :attr:`prompt_cap` and :meth:`budget` before a step is scheduled; :meth:`record` after it ran.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MIN_PROMPT_CHUNK = 32     # the chunk never goes below this (smaller chunks cost more per token; see above)
CHUNK_STEPS = 1.0         # a chunk's prompt part aims at this many decode-only steps' time
STREAM_SHARE = 0.53       # the decoding streams' share of the time while a prompt is paced beside them
DECODE_WINDOW = 9         # decode-only steps whose median is D (wall times under load have a long tail)
MAX_HOLD = 64             # at most this many decode-only steps in a row hold a paced prompt back (a bound for
                          # odd timings, above what a small chunk deep in a long prompt beside one stream needs)
NO_CAP = 1 << 40



def _median(xs: deque[float]) -> float:
    """statistics.median's value (the middle one, or the mean of the middle two), without importing it
    (statistics pulls in fractions and decimal at start-up)."""
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2

@dataclass
class PrefillPacer:
    decode_times: deque[float] = field(default_factory=lambda: deque(maxlen=DECODE_WINDOW))  # decode-only steps
    token_s: float = 0.0       # a prompt token's time in prompt-only steps (moving average)
    adapted: int = 0           # the chunk learnt from steps with prompt and decode rows (0: none yet)
    owed_s: float = 0.0        # time owed to the streams, repaid by decode-only steps (< 0: the prompt's credit)
    held: int = 0              # decode-only full steps since the last paced chunk, while owing

    @property
    def decode_s(self) -> float:
        """D: the median of the recent decode-only full steps' times (0: none seen yet)."""
        return _median(self.decode_times) if self.decode_times else 0.0

    @property
    def prompt_cap(self) -> int:
        """Prompt tokens one step may take beside decoding streams: learnt from mixed steps, else
        estimated from the decode and prompt-token times seen, else no cap."""
        if self.adapted:
            return self.adapted
        if self.decode_s and self.token_s:
            return max(MIN_PROMPT_CHUNK, int(CHUNK_STEPS * self.decode_s / self.token_s))
        return NO_CAP

    @property
    def holding(self) -> bool:
        """Whether the streams are owed time: the next full step takes no prompt tokens beside them."""
        return self.owed_s > 0.0 and self.held < MAX_HOLD

    def budget(self, lane_only: bool) -> int:
        """Prompt tokens the next step may take beside decoding streams (a lane step is never held)."""
        return 0 if self.holding and not lane_only else self.prompt_cap

    def record(self, lane_only: bool, seconds: float, prompt_tokens: int, decoding: bool) -> None:
        """A step ran for ``seconds`` with ``prompt_tokens`` prompt tokens, ``decoding``: beside
        generation rows of running streams; ``lane_only``: a fresh-lane step."""
        if not decoding:
            if prompt_tokens:
                per = seconds / prompt_tokens
                self.token_s = per if not self.token_s else 0.7 * self.token_s + 0.3 * per
            if not lane_only:
                self.owed_s, self.held = 0.0, 0
            return
        if lane_only:
            return
        if not prompt_tokens:
            self.decode_times.append(seconds)
            if self.owed_s > 0.0:   # repays its time, at most 2D (a stall is lost to both); surplus: credit <= D
                d = self.decode_s
                self.owed_s = max(-d, self.owed_s - min(seconds, 2.0 * d))
                self.held += 1
            return
        if not self.decode_times:
            return
        d = self.decode_s
        part = max(seconds - d, 1e-6)
        owed = self.owed_s if self.held < MAX_HOLD else 0.0
        weight = STREAM_SHARE / (1.0 - STREAM_SHARE)
        self.owed_s, self.held = max(-d, owed + weight * part - d), 0
        target = CHUNK_STEPS * d
        self.adapted = max(MIN_PROMPT_CHUNK, min(2 * max(prompt_tokens, MIN_PROMPT_CHUNK),
                                                 round(prompt_tokens * target / part)))
