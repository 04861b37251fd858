"""The fresh lane: a new request's first tokens run in steps of their own, ahead of the running batch.

Why: on a CPU a batch step is compute-bound, its time grows with its rows (SmolLM2-135M, 2 threads:
one row ~4 ms, 17 rows ~21 ms). A request that joins 16 running streams used to wait one batch step
per token: its first 4 tokens took ~5x their idle time. In the spirit of FastServe's skip-join
multi-level feedback queue (new jobs first, demoted as they are served), a request with fewer than
``fresh_tokens`` output tokens runs in *lane* steps without the older requests, so its first tokens
come at about idle speed; the older requests then wait for those small steps (~4 ms each here).

Bound: lane steps run only while their time since the last full step is below that full step's time,
so however requests arrive, the running streams get at least every other unit of step time (at most
2x slower). Off when ``fresh_tokens`` is 0, and for a step where any running request holds drafted
tokens (speculative decoding verifies drafts in the step they were proposed for). Which step computes
a row never changes its result (batch invariance), so outputs are the same with the lane on or off.

Long prompts beside running streams (prefill pacing): a step that decodes running streams takes at most
``prompt_cap`` prompt tokens, adapted after every such step so the step costs about twice a decode-only
step (the streams keep about half their rate; the prompt gets about half the machine, so its time to the
first token stays near twice its time alone). A prompt whose remainder exceeds the cap is not fresh: it
advances in full steps beside the streams, never in lane steps they wait out. Chunking never changes a
row's bits, so outputs are the same whatever the cap.

Contract: :meth:`lane_only` before a step is scheduled; :meth:`record` after it ran, with its time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hitenter.engine.request import Request

MIN_PROMPT_CHUNK = 32     # the cap never goes below this (per-step overheads would dominate). Measured with
                          # bench/long_prompt_streams.py (SmolLM2, 16 streams, a 4,000-token prompt, AVX2, 2
                          # threads): 32 -> streams keep 0.30x, the prompt's TTFT 1.31x alone; 8 -> 0.40x and
                          # 2.59x: small chunks pay a pass over the weights each, so the sum of both shares fell
NO_CAP = 1 << 40


@dataclass
class FreshLane:
    fresh_tokens: int
    full_step_s: float = 0.0   # the last full step's time (0 until one has been recorded: no lane)
    lane_s: float = 0.0        # lane steps' time since that step
    decode_s: float = 0.0      # recent decode-only steps' time (moving average; 0: none seen yet)
    token_s: float = 0.0       # a prompt token's time in prompt-only steps (moving average)
    adapted: int = 0           # the cap learnt from steps with prompt and decode rows (0: none yet)

    @property
    def prompt_cap(self) -> int:
        """Prompt tokens a step may take beside decoding streams: learnt from mixed steps, else estimated
        from the decode and prompt-token times seen, else no cap."""
        if self.adapted:
            return self.adapted
        if self.decode_s and self.token_s:
            return max(MIN_PROMPT_CHUNK, int(self.decode_s / self.token_s))
        return NO_CAP

    def is_fresh(self, req: Request) -> bool:
        return (len(req.output_token_ids) < self.fresh_tokens
                and req.num_tokens - req.num_computed_tokens <= self.prompt_cap)

    def lane_only(self, running: Sequence[Request], waiting: Sequence[Request]) -> bool:
        """Whether the next step runs fresh requests only: there is a fresh request (running, or at the
        head of the queue) and an older running one, no drafts are pending, and the lane has time left."""
        if self.fresh_tokens <= 0 or self.lane_s >= self.full_step_s:
            return False
        if any(r.spec_token_ids for r in running):
            return False
        fresh = any(self.is_fresh(r) for r in running) or (bool(waiting) and self.is_fresh(waiting[0]))
        return fresh and not all(self.is_fresh(r) for r in running)

    def record(self, lane_only: bool, seconds: float, prompt_tokens: int = 0, decoding: bool = False) -> None:
        """A step ran for ``seconds`` (a lane step, or a full one) with ``prompt_tokens`` prompt tokens,
        ``decoding``: beside generation rows of running streams."""
        if lane_only:
            self.lane_s += seconds
        else:
            self.full_step_s, self.lane_s = seconds, 0.0
        if not decoding:
            if prompt_tokens:
                per = seconds / prompt_tokens
                self.token_s = per if not self.token_s else 0.7 * self.token_s + 0.3 * per
            return
        if not prompt_tokens:
            self.decode_s = seconds if not self.decode_s else 0.7 * self.decode_s + 0.3 * seconds
        elif self.decode_s:   # aim the prompt part at one decode step's time: the step costs ~2 decode steps
            scale = self.decode_s / max(seconds - self.decode_s, 1e-6)
            self.adapted = max(MIN_PROMPT_CHUNK, min(2 * max(prompt_tokens, MIN_PROMPT_CHUNK),
                                                     round(prompt_tokens * scale)))
