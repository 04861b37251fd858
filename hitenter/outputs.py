"""What the engine hands back: one RequestOutput per request, holding n CompletionOutputs (vLLM's shape).

Fields are cumulative (``text``, ``token_ids``); the ``delta_*`` fields hold what this step added,
which is what a streaming client sends on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int                      # 1 = most likely under the model's raw distribution
    token: str = ""                # the token's text piece


@dataclass
class PositionLogprobs:
    """The chosen token at one output position and the top alternatives (raw model distribution)."""

    chosen: TokenLogprob
    top: list[TokenLogprob] = field(default_factory=list)


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None          # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None      # matched stop string or stop token id
    logprobs: list[PositionLogprobs] | None = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[PositionLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float | None:
        if self.logprobs is None:
            return None
        return sum(p.chosen.logprob for p in self.logprobs)


@dataclass
class RequestMetricsSnapshot:
    arrival_time: float
    queue_time: float | None
    time_to_first_token: float | None
    token_times: list[float]
    finished_time: float | None
    num_preemptions: int

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: RequestMetricsSnapshot | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # Convenience for the common n == 1 case: outs[0].text instead of outs[0].outputs[0].text
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def stop_reason(self) -> int | str | None:
        return self.outputs[0].stop_reason

    @property
    def logprobs(self) -> list[PositionLogprobs] | None:
        return self.outputs[0].logprobs
