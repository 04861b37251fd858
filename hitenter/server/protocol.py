"""OpenAI-compatible request schemas and the response pieces built from engine outputs.

Requests ignore unknown fields (``extra="ignore"``) like vLLM and OpenAI. Sampling fields are kept
loosely typed here; :class:`hitenter.sampling_params.SamplingParams` does the real validation and
its ``ValueError`` messages start with the field name, which becomes the error's ``param``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from hitenter.sampling_params import SamplingParams
from hitenter.server.request_extras import ChatExtras, GuidedFields


class SafeJSONResponse(JSONResponse):
    """JSON whose strings may hold lone surrogates (from ``\\ud800`` escapes in a request): replaced, not a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8", "replace")


class APIError(Exception):
    """An error with an HTTP status, rendered as ``{"error": {message, type, param, code, **extra}}``."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
             405: "MethodNotAllowedError", 429: "RateLimitError", 500: "InternalServerError",
             501: "NotImplementedError", 503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.extra = extra

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.TYPES.get(self.status, "APIError"),
                               "param": self.param, "code": self.status}
        err.update(self.extra)
        return {"error": err}


def param_of(message: str) -> str | None:
    """SamplingParams/engine ValueErrors start with the field name: ``"top_p: must be ..."``."""
    head, sep, _ = message.partition(":")
    return head if sep and head.isidentifier() else None


def validation_error(exc: RequestValidationError) -> APIError:
    errs = exc.errors()
    if not errs:
        return APIError(400, "invalid request")
    first = errs[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"invalid JSON body: {first.get('msg', '')}")
    param = ".".join(loc) or None
    msgs = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg', '')}"
                     for e in errs[:5])
    return APIError(400, msgs, param)


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Base):
    include_usage: bool = False


class _SamplingRequest(GuidedFields, _Base):
    # unknown fields are kept (not ignored) so that request_extras.check_known_fields can 400 them
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "n": self.n, "temperature": 1.0 if self.temperature is None else self.temperature,
            "seed": self.seed, "stop": self.stop, "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens, "logit_bias": self.logit_bias,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
        }
        for name in ("top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        return kw

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def to_sampling_params(self) -> SamplingParams:
        if self.suffix:
            raise APIError(400, "suffix: is not supported", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(400, "best_of: only best_of == n is supported", "best_of")
        max_tokens = 16 if self.max_tokens is None else self.max_tokens   # OpenAI's legacy default
        if max_tokens == 0 and self.echo:    # scoring only (lm-eval): the prompt's logprobs, no generation
            max_tokens = 1
        return SamplingParams(**self.sampling_kwargs(), max_tokens=max_tokens, logprobs=self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt: must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ContentPart(_Base):
    type: str
    text: str | None = None


class ChatMessage(_Base):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None     # assistant turns that called tools
    tool_call_id: str | None = None                    # tool results

    def as_dict(self) -> dict[str, Any]:
        c = self.content
        if isinstance(c, list):
            bad = [p.type for p in c if p.type != "text" or p.text is None]
            if bad:
                raise APIError(400, f"messages: only text content parts are supported, got {bad[0]!r}",
                               "messages")
            c = "".join(p.text or "" for p in c)
        d: dict[str, Any] = {"role": self.role, "content": c or ""}
        if self.name:
            d["name"] = self.name
        if self.tool_calls or self.tool_call_id:
            from hitenter.server.tools import message_tool_fields

            d.update(message_tool_fields(self.tool_calls, self.tool_call_id))
        return d


class ChatCompletionRequest(ChatExtras, _SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs: requires logprobs to be true", "top_logprobs")
        lp = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        try:
            return SamplingParams(**self.sampling_kwargs(), max_tokens=max_tokens, logprobs=lp)
        except ValueError as e:
            msg = str(e)
            if msg.startswith("logprobs:"):
                raise APIError(400, "top_logprobs" + msg[len("logprobs"):], "top_logprobs") from e
            if msg.startswith("max_tokens:") and self.max_completion_tokens is not None:
                raise APIError(400, "max_completion_tokens" + msg[len("max_tokens"):],
                               "max_completion_tokens") from e
            raise

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.as_dict() for m in self.messages]


class TokenizeRequest(_Base):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True      # False: no BOS (lm-eval's remote tokenizer sends it)


class DetokenizeRequest(_Base):
    model: str | None = None
    tokens: list[int]


# ---- responses ---------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
