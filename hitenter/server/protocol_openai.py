"""OpenAI's request bodies (/v1/chat/completions, /v1/completions' shared sampling fields) and vLLM's
additions: the sampling fields of both bodies (``SamplingRequest``, mapped to SamplingParams by one table,
``SAMPLING``), structured outputs (``response_format`` and vLLM's guided_* / ``structured_outputs``: at
most one), chat messages (content parts, tool calls, an earlier turn's thinking), tools.

Top-level bodies keep unknown fields in ``model_extra`` so that ``check_known_fields`` (api_error.py)
refuses them by name (400, as OpenAI does); nested objects forbid them outright; numbers are strict
(hitenter/server/schema_types.py). Ranges are left to SamplingParams, whose ``ValueError`` messages start
with the field name, which becomes the error's ``param``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import MaxLen, MinLen
from pydantic import BaseModel, ConfigDict, Field

from hitenter.sampling_params import SamplingParams, StructuredSpec
from hitenter.server import field_limits as limits
from hitenter.server import structured_fields as SF
from hitenter.server.api_error import APIError
from hitenter.server.schema_types import (
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


class ToolFunction(_Nested):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class Tool(_Nested):
    type: str = "function"
    function: ToolFunction


def message_tool_fields(tool_calls: list[dict[str, Any]] | None, tool_call_id: str | None,
                        param: str = "messages") -> dict[str, Any]:
    """Template-ready tool fields of a message: arguments as objects (templates ``tojson`` them)."""
    out: dict[str, Any] = {}
    if tool_call_id:
        out["tool_call_id"] = tool_call_id
    if tool_calls:
        calls = []
        for tc in tool_calls:
            fn = dict(tc.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                fn["arguments"] = limits.loads(args, param, "tool call arguments are not JSON") if args.strip() else {}
            calls.append({**tc, "function": fn})
        out["tool_calls"] = calls
    return out


class StreamOptions(_Nested):
    include_usage: Bool = False
    continuous_usage_stats: Bool = False     # vLLM's: every chunk carries the usage so far


STRUCTURED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                     "structured_outputs")


class StructuredFields(BaseModel):
    """OpenAI's ``response_format`` and vLLM's guided_* / ``structured_outputs``: at most one."""
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[Annotated[str, MinLen(1)]], MinLen(1)] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None    # vLLM >= 0.10: {json | regex | choice | grammar}
    prompt_logprobs: PromptLogprobs | None = None

    def structured_spec(self) -> StructuredSpec | None:
        if all(getattr(self, f) is None for f in STRUCTURED_FIELDS):
            return None
        return SF.one_of([
            ("response_format", SF.response_format_spec(self.response_format)),
            ("guided_json", SF.schema_spec(self.guided_json, "guided_json")),
            ("guided_regex", SF.text_spec("regex", self.guided_regex, "guided_regex")),
            ("guided_choice", SF.choice_spec(self.guided_choice, "guided_choice")),
            ("guided_grammar", SF.text_spec("grammar", self.guided_grammar, "guided_grammar")),
            ("structured_outputs", SF.structured_outputs_spec(self.structured_outputs)),
        ])


# the sampling fields both bodies share, each SamplingParams' field of the same name (max_tokens and
# logprobs are the endpoint's own: chat has max_completion_tokens and top_logprobs)
SAMPLING = ("n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "logit_bias", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
            "include_stop_str_in_output", "skip_special_tokens")
DEFAULTS = {"temperature": 1.0}          # OpenAI's documented default


class SamplingRequest(StructuredFields, _Lenient):

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
        """The sampling fields as SamplingParams' keywords (SAMPLING: a field left null keeps
        SamplingParams' default, except DEFAULTS), validated once by SamplingParams."""
        got = {name: getattr(self, name) for name in SAMPLING if getattr(self, name) is not None}
        return {**DEFAULTS, **got}

    @property
    def echoes_logprobs(self) -> bool:
        """Legacy completions' ``echo`` + ``logprobs``: the prompt's logprobs before the completion's."""
        return False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


# /v1 request bodies refuse fields they do not define (check_known_fields: 400 naming it)
NO_UNKNOWN: dict[str, Any] = {"additionalProperties": False}


def requires_when(field: str, value: Any, then: dict[str, Any], present: bool = False) -> dict[str, Any]:
    """JSON Schema for a rule between fields: when ``field`` is ``value``, ``then`` holds (and its
    fields must be given when ``present``)."""
    rule: dict[str, Any] = {"properties": then, **({"required": list(then)} if present else {})}
    return {"if": {"properties": {field: value}, "required": [field]}, "then": rule}


Role = Literal["system", "user", "assistant", "tool"]


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


class ChatExtras(BaseModel):
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: Bool | None = None
    continue_final_message: Bool = False
    echo: Bool = False
    reasoning_effort: ReasoningEffort | None = None          # OpenAI's; "none" turns thinking off
    chat_template_kwargs: dict[str, Any] | None = None       # vLLM / llama-server: template variables
    thinking_token_budget: NonNegInt | None = None           # vLLM's: tokens the thinking section may take

    def thinking_kwargs(self, template_vars: Any) -> dict[str, Any]:
        """The template variables that switch thinking (chat_format.ChatFormat), then the client's own."""
        effort = self.reasoning_effort
        think = None if effort is None else effort != "none"
        level = effort if effort in ("low", "medium", "high") else ("low" if effort == "minimal" else None)
        extra = self.chat_template_kwargs or {}
        bad = [k for k in extra if k in _RESERVED_VARS or not k.isidentifier()]
        if bad:
            raise APIError(400, f"chat_template_kwargs: {bad[0]!r} cannot be set (reserved or not a name)",
                           "chat_template_kwargs")
        return {**template_vars(think, level), **extra}


_RESERVED_VARS = {"messages", "add_generation_prompt", "tokenize", "special_in_content", "continue_final",
                  "param", "tools", "documents"}


class ImageUrl(_Nested):
    url: str
    detail: str | None = None                          # OpenAI's hint; the encoder's own size is used


class ContentPart(_Nested):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageUrl | str | None = None            # a base64 data: URL (hitenter/server/image_chat.py)

    def as_dict(self, param: str) -> dict[str, Any]:
        """The part as the chat path takes it; 400 for a part without its field."""
        if self.type == "text" and self.text is None:
            raise APIError(400, f"{param}.text: a text part needs its text", f"{param}.text")
        if self.type == "image_url" and self.image_url is None:
            raise APIError(400, f"{param}.image_url: an image_url part needs its image_url", f"{param}.image_url")
        return self.model_dump(exclude_none=True)


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
    reasoning_content: str | None = None               # an assistant turn's thinking (vLLM / llama-server)
    reasoning: str | None = None                       # ... under vLLM's newer name
    # OpenAI's own assistant-message fields, as a client sends back a message it received: only empty
    refusal: None = None
    function_call: None = None
    audio: None = None
    annotations: Annotated[list[Any], MaxLen(0)] | None = None

    def as_dict(self) -> dict[str, Any]:
        c = self.content
        if isinstance(c, list) and any(p.type == "image_url" for p in c):   # kept as parts: images
            c = [p.as_dict(f"messages.content.{j}") for j, p in enumerate(c)]
        elif isinstance(c, list):
            bad = [p.type for p in c if p.type != "text" or p.text is None]
            if bad:
                raise APIError(400, f"messages: only text content parts are supported, got {bad[0]!r}",
                               "messages")
            c = "".join(p.text or "" for p in c)
        d: dict[str, Any] = {"role": self.role, "content": c or ""}
        if self.name:
            d["name"] = self.name
        if self.reasoning_content or self.reasoning:
            d["reasoning_content"] = self.reasoning_content or self.reasoning
        if self.tool_calls or self.tool_call_id:
            calls = [tc.model_dump(exclude_none=True) for tc in self.tool_calls or []]
            d.update(message_tool_fields(calls or None, self.tool_call_id))
        return d


class ChatCompletionRequest(ChatExtras, SamplingRequest):
    model_config = ConfigDict(extra="allow", json_schema_extra={**NO_UNKNOWN, "allOf": [
        requires_when("top_logprobs", {"type": "integer"}, {"logprobs": {"const": True}}, present=True),
        requires_when("continue_final_message", {"const": True}, {"add_generation_prompt": {"const": False}},
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
