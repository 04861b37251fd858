"""OpenAI's request schemas (/v1/completions, /v1/chat/completions) and vLLM's (/tokenize, /detokenize).

Top-level bodies keep unknown fields in ``model_extra`` so that ``check_known_fields`` can refuse
them by name (400, as OpenAI does); nested objects (messages, content parts, tools, tool calls,
stream_options) forbid them outright; numbers are strict (hitenter/server/schema_types.py). Ranges
are left to :class:`hitenter.sampling_params.SamplingParams`, whose ``ValueError`` messages start with
the field name, which becomes the error's ``param``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import Interval, MaxLen, MinLen
from pydantic import BaseModel, ConfigDict, Field

from hitenter.engine.structured import GuidedSpec
from hitenter.sampling_params import SamplingParams
from hitenter.server import guided as G
from hitenter.server.api_error import APIError
from hitenter.server.schema_types import (
    NO_BOOL,
    STRICT,
    Bias,
    Bool,
    Count,
    Fraction,
    NLogprobs,
    NonEmpty,
    NonNegInt,
    Penalty,
    PositiveFloat,
    PositiveInt,
    PromptLogprobs,
    Seed,
    Temperature,
    TokenId,
    TokenKey,
    TopK,
    TopP,
)
from hitenter.server.schema_types import Lenient as _Lenient
from hitenter.server.schema_types import Nested as _Nested
from hitenter.server.tools import message_tool_fields

Role = Literal["system", "user", "assistant", "tool"]
METADATA_FIELDS = frozenset({"user"})       # sent by clients as pure metadata (no effect on generation)


def check_known_fields(req: BaseModel) -> None:
    """400 for fields the request model does not define (``extra="allow"`` keeps them in model_extra);
    ``stream_options`` without ``stream`` is a 400 too (as vLLM does)."""
    extra = sorted(set(req.model_extra or {}) - METADATA_FIELDS)
    if extra:
        raise APIError(400, f"{extra[0]}: unsupported request field(s) {extra}; see the README for the fields "
                       "this server implements", extra[0])
    if getattr(req, "stream_options", None) is not None and not getattr(req, "stream", False):
        raise APIError(400, "stream_options: only allowed when stream is true", "stream_options")


class StreamOptions(_Nested):
    include_usage: Bool = False
    continuous_usage_stats: Bool = False     # vLLM's: every chunk carries the usage so far


class GuidedFields(BaseModel):
    """OpenAI's ``response_format`` and vLLM's guided_* / ``structured_outputs``: at most one."""
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[Annotated[str, MinLen(1)]], MinLen(1)] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None    # vLLM >= 0.10: {json | regex | choice | grammar}
    prompt_logprobs: PromptLogprobs | None = None

    def guided_spec(self) -> GuidedSpec | None:
        return G.one_of([
            ("response_format", G.response_format_spec(self.response_format)),
            ("guided_json", G.schema_spec(self.guided_json, "guided_json")),
            ("guided_regex", G.text_spec("regex", self.guided_regex, "guided_regex")),
            ("guided_choice", G.choice_spec(self.guided_choice, "guided_choice")),
            ("guided_grammar", G.text_spec("grammar", self.guided_grammar, "guided_grammar")),
            ("structured_outputs", G.structured_outputs_spec(self.structured_outputs)),
        ])


class ToolFunction(_Nested):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class Tool(_Nested):
    type: str = "function"
    function: ToolFunction


class ChatExtras(BaseModel):
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: Bool | None = None
    continue_final_message: Bool = False
    echo: Bool = False


class _SamplingRequest(GuidedFields, _Lenient):

    model: str | None = None
    n: Count = 1
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: Fraction | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: PositiveFloat | None = None
    # keys other than the pattern's are refused: the schema says so (patternProperties alone admits any)
    logit_bias: Annotated[dict[TokenKey, Bias], Field(json_schema_extra={"additionalProperties": False})] | None = None
    seed: Seed | None = None
    stop: NonEmpty | list[NonEmpty] | None = None
    stop_token_ids: list[TokenId] | None = None
    max_tokens: PositiveInt | None = None
    ignore_eos: Bool = False
    min_tokens: NonNegInt = 0
    include_stop_str_in_output: Bool = False
    skip_special_tokens: Bool = True
    stream: Bool = False
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

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


# /v1 request bodies refuse fields they do not define (check_known_fields: 400 naming it)
_NO_UNKNOWN: dict[str, Any] = {"additionalProperties": False}


def _requires(field: str, value: Any, then: dict[str, Any], present: bool = False) -> dict[str, Any]:
    """JSON Schema for a rule between fields: when ``field`` is ``value``, ``then`` holds (and its
    fields must be given when ``present``)."""
    rule: dict[str, Any] = {"properties": then, **({"required": list(then)} if present else {})}
    return {"if": {"properties": {field: value}, "required": [field]}, "then": rule}


class CompletionRequest(_SamplingRequest):
    # max_tokens 0 scores the prompt only (echo: lm-eval's loglikelihood requests); else >= 1
    model_config = ConfigDict(extra="allow", json_schema_extra={**_NO_UNKNOWN, "allOf": [
        _requires("max_tokens", {"const": 0}, {"echo": {"const": True}}, present=True),
        _requires("best_of", {"const": 1}, {"n": {"const": 1}})]})
    prompt: NonEmpty | Annotated[list[NonEmpty], MinLen(1)] | Annotated[list[TokenId], MinLen(1)] \
        | Annotated[list[Annotated[list[TokenId], MinLen(1)]], MinLen(1)]
    logprobs: NLogprobs | None = None
    echo: Bool = False
    suffix: Annotated[str, MaxLen(0)] | None = None
    # best_of: only 1, with n = 1 (no best-of selection; JSON Schema can state this, unlike best_of == n)
    best_of: Annotated[int, Interval(ge=1, le=1), STRICT, NO_BOOL] | None = None
    max_tokens: NonNegInt | None = None

    def to_sampling_params(self) -> SamplingParams:
        if self.max_tokens == 0 and not self.echo:
            raise APIError(400, "max_tokens: 0 is only allowed with echo (scoring the prompt)", "max_tokens")
        if self.suffix:
            raise APIError(400, "suffix: is not supported", "suffix")
        if self.best_of is not None and self.n != 1:
            raise APIError(400, "best_of: only 1 is supported, with n = 1 (omit it to get n completions)", "best_of")
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


class ContentPart(_Nested):
    type: Literal["text"]
    text: str


class FunctionCall(_Nested):
    name: str
    arguments: str | dict[str, Any]                    # OpenAI sends a JSON string; some clients an object


class ToolCall(_Nested):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall
    index: NonNegInt | None = None                     # present when a client joins streamed deltas


class ChatMessage(_Nested):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None           # assistant turns that called tools
    tool_call_id: str | None = None                    # tool results
    # OpenAI's own assistant-message fields, as a client sends back a message it received: only empty
    refusal: None = None
    function_call: None = None
    audio: None = None
    annotations: Annotated[list[Any], MaxLen(0)] | None = None

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
            calls = [tc.model_dump(exclude_none=True) for tc in self.tool_calls or []]
            d.update(message_tool_fields(calls or None, self.tool_call_id))
        return d


class ChatCompletionRequest(ChatExtras, _SamplingRequest):
    model_config = ConfigDict(extra="allow", json_schema_extra={**_NO_UNKNOWN, "allOf": [
        _requires("top_logprobs", {"type": "integer"}, {"logprobs": {"const": True}}, present=True),
        _requires("continue_final_message", {"const": True}, {"add_generation_prompt": {"const": False}},
                  present=True)]})
    messages: Annotated[list[ChatMessage], MinLen(1)]
    logprobs: Bool = False
    top_logprobs: NLogprobs | None = None
    max_completion_tokens: PositiveInt | None = None
    add_generation_prompt: Bool = True

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


class TokenizeRequest(BaseModel):
    """Exactly one of ``prompt`` or ``messages`` (neither may be null)."""
    model_config = ConfigDict(extra="ignore", json_schema_extra={"oneOf": [{"required": ["prompt"]},
                                                                        {"required": ["messages"]}]})
    model: str | None = None
    prompt: str = None                                                 # type: ignore[assignment]
    messages: Annotated[list[ChatMessage], MinLen(1)] = None           # type: ignore[assignment]
    add_generation_prompt: Bool = True
    add_special_tokens: Bool = True      # False: no BOS (lm-eval's remote tokenizer sends it)


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[TokenId]
