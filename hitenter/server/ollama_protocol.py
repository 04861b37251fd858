"""Ollama's request bodies (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/show) and its
``options``, mapped onto SamplingParams.

Strict like every surface here: an unknown field or option is a 400 that names it, numbers are strict.
Defaults are Ollama's documented ones (temperature 0.8, top_k 40, top_p 0.9, num_predict -1: until the
window ends), except ``repeat_penalty``, 1.0 here: hitenter's repetition penalty counts the whole
sequence, Ollama's 1.1 the last 64 tokens only (``repeat_last_n`` is accepted as -1, the whole context,
only). ``num_ctx`` narrows the request's window (at most the server's ``--max-model-len``: a larger one
is a 400, never silently cut). ``keep_alive`` is accepted and has no effect: models stay loaded while
the server runs. Images and thinking are refused (400): no served model has them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import Interval, MinLen
from pydantic import BaseModel, model_validator

from hitenter.server.protocol import Tool
from hitenter.server.schema_types import (
    NO_BOOL,
    STRICT,
    Bool,
    Fraction,
    NLogprobs,
    NonEmpty,
    Penalty,
    PositiveFloat,
    PositiveInt,
    Seed,
    TokenId,
    TopK,
)
from hitenter.server.schema_types import Nested as _Nested

DEFAULTS: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}   # Ollama's; num_predict -1
SUPPORTED = ("temperature", "top_k", "top_p", "min_p", "seed", "num_predict", "stop", "num_ctx", "repeat_penalty",
             "repeat_last_n", "presence_penalty", "frequency_penalty")
Temperature = Annotated[float, Interval(ge=0, le=100), STRICT, NO_BOOL]
NumPredict = Annotated[int, Interval(ge=-2), STRICT, NO_BOOL]
KeepAlive = Annotated[float, STRICT, NO_BOOL] | str


class Options(BaseModel):
    """Ollama's ``options`` that this server implements; any other option is a 400 naming it."""
    temperature: Temperature | None = None
    top_k: TopK | None = None
    top_p: Fraction | None = None
    min_p: Fraction | None = None
    seed: Seed | None = None
    num_predict: NumPredict | None = None
    stop: list[NonEmpty] | None = None
    num_ctx: PositiveInt | None = None
    repeat_penalty: PositiveFloat | None = None
    repeat_last_n: Annotated[int, Interval(ge=-1, le=-1), STRICT, NO_BOOL] | None = None   # -1: the whole context
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        if isinstance(data, dict):
            extra = sorted(set(data) - set(SUPPORTED))
            if extra:
                raise ValueError(f"unsupported option(s) {extra}; this server implements {list(SUPPORTED)}")
        return data

    def sampling_kwargs(self) -> dict[str, Any]:
        """SamplingParams keywords: Ollama's defaults where an option is not given."""
        kw: dict[str, Any] = dict(DEFAULTS)
        for name in ("temperature", "top_k", "top_p", "min_p", "seed", "stop", "presence_penalty",
                     "frequency_penalty"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        if self.repeat_penalty is not None:
            kw["repetition_penalty"] = self.repeat_penalty
        if self.num_predict == 0:
            raise ValueError("num_predict: 0 generates nothing; give >= 1, or -1 for the rest of the window")
        kw["max_tokens"] = self.num_predict if self.num_predict and self.num_predict > 0 else None
        return kw


class FunctionCall(_Nested):
    name: str
    arguments: dict[str, Any] = {}
    index: Annotated[int, Interval(ge=0), STRICT, NO_BOOL] | None = None


class ToolCall(_Nested):
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


class Message(_Nested):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[Any] | None = None                                  # refused when not empty (no vision)
    thinking: str | None = None                                      # an earlier turn's: not rendered
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Generation(_Nested):
    model: NonEmpty
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options | None = None
    stream: Bool = True
    keep_alive: KeepAlive | None = None
    think: Bool | Literal["low", "medium", "high"] | None = None
    logprobs: Bool | None = None
    top_logprobs: NLogprobs | None = None


class ChatRequest(_Generation):
    messages: list[Message] = []
    tools: list[Tool] | None = None


class GenerateRequest(_Generation):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None              # refused when not empty: the model's own template renders
    context: list[TokenId] | None = None
    raw: Bool = False
    images: list[Any] | None = None


class EmbedRequest(_Nested):
    model: NonEmpty
    input: str | Annotated[list[str], MinLen(1)]
    truncate: Bool | None = None
    options: Options | None = None
    keep_alive: KeepAlive | None = None
    dimensions: PositiveInt | None = None


class EmbeddingsRequest(_Nested):
    model: NonEmpty
    prompt: str
    options: Options | None = None
    keep_alive: KeepAlive | None = None


class ShowRequest(_Nested):
    model: NonEmpty | None = None
    name: NonEmpty | None = None            # the older spelling
    verbose: Bool | None = None


def base_name(name: str) -> str:
    """``tiny:latest`` -> ``tiny`` (Ollama's default tag); other tags are part of the name."""
    return name[:-len(":latest")] if name.endswith(":latest") else name


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"
