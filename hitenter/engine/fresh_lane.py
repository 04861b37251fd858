"""The fresh lane: a new request's first tokens run in steps of their own, ahead of the running batch.

Why: on a CPU a batch step is compute-bound, its time grows with its rows. A request that joins
many running streams and waits one batch step per token gets its first tokens several times slower than
on an idle server. In the spirit of FastServe's skip-join
multi-level feedback queue (new jobs first, demoted as they are served), a request with fewer than
``fresh_tokens`` output tokens runs in *lane* steps without the older requests, so its first tokens
come at about idle speed; the older requests then wait for those small steps (about one row's time each).

Bound: lane steps run only while their time since the last full step is below that full step's time,
so however requests arrive, the running streams get at least every other unit of step time (at most
2x slower). Off when ``fresh_tokens`` is 0, and for a step where any running request holds drafted
tokens (speculative decoding verifies drafts in the step they were proposed for). Which step computes
a row never changes its result (batch invariance), so outputs are the same with the lane on or off.

Long prompts beside running streams (prefill_pacing.py): a prompt whose remainder exceeds the pacer's
chunk is not fresh: it advances in paced full steps beside the streams, never in lane steps they wait out.

Contract: :meth:`lane_only` before a step is scheduled; :meth:`record` after it ran, with its time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hitenter.engine.prefill_pacing import PrefillPacer
from hitenter.request import Request


@dataclass
class FreshLane:
    fresh_tokens: int
    full_step_s: float = 0.0   # the last full step's time (0 until one has been recorded: no lane)
    lane_s: float = 0.0        # lane steps' time since that step
    pacer: PrefillPacer = field(default_factory=PrefillPacer)   # its chunk bounds a fresh prompt

    def is_fresh(self, req: Request) -> bool:
        return (len(req.output_token_ids) < self.fresh_tokens
                and req.num_tokens - req.num_computed_tokens <= self.pacer.prompt_cap)

    def lane_only(self, running: Sequence[Request], waiting: Sequence[Request]) -> bool:
        """Whether the next step runs fresh requests only: there is a fresh request (running, or at the
        head of the queue) and an older running one, no drafts are pending, and the lane has time left."""
        if self.fresh_tokens <= 0 or self.lane_s >= self.full_step_s:
            return False
        if any(r.spec_token_ids for r in running):
            return False
        fresh = any(self.is_fresh(r) for r in running) or (bool(waiting) and self.is_fresh(waiting[0]))
        return fresh and not all(self.is_fresh(r) for r in running)

    def record(self, lane_only: bool, seconds: float) -> None:
        """A step ran for ``seconds``: a lane step, or a full one."""
        if lane_only:
            self.lane_s += seconds
        else:
            self.full_step_s, self.lane_s = seconds, 0.0
