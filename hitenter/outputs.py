"""What the engine hands back: one RequestOutput per request, holding n CompletionOutputs (vLLM's shape).

Fields are cumulative (``text``, ``token_ids``); the ``delta_*`` fields hold what this step added,
which is what a streaming client sends on.

The engine builds an output every step, so its cumulative fields (``text``, ``token_ids``, ``logprobs``,
``metrics.token_times``) may be given as a ``Prefix`` / ``Joined`` of the engine's append-only lists: a
step then costs nothing per token already produced, and the copy (a plain list / str, the same value
as before) is made on first read, by the reader, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Prefix:
    """The first ``n`` items of an append-only list, copied on first read."""

    __slots__ = ("src", "n")

    def __init__(self, src: list[Any], n: int) -> None:
        self.src, self.n = src, n

    def get(self) -> list[Any]:
        return self.src[:self.n]


class Joined(Prefix):
    """``"".join`` of the first ``n`` strings of an append-only list of pieces, made on first read."""

    __slots__ = ()

    def get(self) -> str:  # type: ignore[override]
        return "".join(self.src[:self.n])


_EMPTY = object()
_REQUIRED = object()


class _Lazy:
    """A dataclass field that may hold a Prefix / Joined: replaced by its value on first read.
    ``default`` is the field's default (``list``: a fresh empty list per instance)."""

    def __init__(self, default: Any) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_lazy_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            if self.default is _REQUIRED:
                raise AttributeError(self.slot)   # dataclasses: the field has no default
            return _EMPTY if self.default is list else self.default
        v = obj.__dict__[self.slot]
        if isinstance(v, Prefix):
            v = obj.__dict__[self.slot] = v.get()
        elif v is _EMPTY:
            v = obj.__dict__[self.slot] = []
        return v

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.slot] = value


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
    text: str = _Lazy("")  # type: ignore[assignment]
    token_ids: list[int] = _Lazy(list)  # type: ignore[assignment]
    finish_reason: str | None = None          # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None      # matched stop string or stop token id
    logprobs: list[PositionLogprobs] | None = _Lazy(None)  # type: ignore[assignment]
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
    token_times: list[float] = _Lazy(_REQUIRED)  # type: ignore[assignment]
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
