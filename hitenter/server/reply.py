"""One assistant reply (one prompt, one choice) as the non-OpenAI-chat surfaces see it: Ollama's chat and
generate, OpenAI Responses and Anthropic Messages build their bodies and streams from this.

``Reply.of(out, plan)``: a finished RequestOutput split into content and tool calls, with its finish
and token counts. ``reply_events(src, plan)``: a stream of ``Piece`` (text safe to send now, the
logprobs of the tokens it came from) ending in one ``Done`` (the Reply); text that may still become a
``<tool_call>`` is held back (tools.ToolTextStream).

OpenAI's request schemas (/v1/completions, /v1/chat/completions) and vLLM's (/tokenize, /detokenize).

Top-level bodies keep unknown fields in ``model_extra`` so that ``check_known_fields`` can refuse
them by name (400, as OpenAI does); nested objects (messages, content parts, tools, tool calls,
stream_options) forbid them outright; numbers are strict (hitenter/server/schema_types.py). Ranges
are left to :class:`hitenter.sampling_params.SamplingParams`, whose ``ValueError`` messages start with
the field name, which becomes the error's ``param``.

Tool calling for every surface: tools rendered through the model's own chat template (its ``tools``
variable), the model's ``<tool_call>{json}</tool_call>`` markup (Qwen2.5 / Hermes) parsed into calls.

A surface turns its own spelling into ``plan_tools(tools, choice, parallel, chat_template)``:
``tools`` in OpenAI's ``{"type": "function", "function": {name, description, parameters}}`` form,
``choice`` one of ``none`` (render no tools, parse nothing), ``auto`` (the model decides), ``required``
or ``{"type": "function", "function": {"name": ...}}`` (generation constrained by the grammar to
``<tool_call>`` blocks whose JSON is ``{"name": <an allowed function>, "arguments": <its parameters
schema>}``); ``parallel: False`` allows (and keeps) one call. A template without a ``tools`` variable
(SmolLM2's) -> 400.

Calls come back as ``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}``;
``ToolTextStream`` holds streamed text back while it may still turn into a call.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.sampling_params import StructuredSpec
from hitenter.server import field_limits as limits
from hitenter.server.api_error import APIError
from hitenter.server.generation import Source
from hitenter.server.schema_types import (
    Bool,
)
from hitenter.server.schema_types import Nested as _Nested

OPEN, CLOSE = "<tool_call>", "</tool_call>"


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolPlan:
    mode: str                                   # "none" | "auto" | "required" | "named"
    tools: list[dict[str, Any]] = field(default_factory=list)
    parallel: bool = True
    structured: StructuredSpec | None = None

    @property
    def parses(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def template_kwargs(self) -> dict[str, Any]:
        return {"tools": self.tools} if self.parses else {}


NO_TOOLS = ToolPlan("none")


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


def _call_schema(fn: dict[str, Any]) -> dict[str, Any]:
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def _named_choice(choice: dict[str, Any]) -> bool:
    """``{"type": "function", "function": {"name": str}}`` and nothing else."""
    fn = choice.get("function")
    return (set(choice) <= {"type", "function"} and choice.get("type", "function") == "function"
            and isinstance(fn, dict) and set(fn) == {"name"} and isinstance(fn["name"], str))


def plan_tools(tools: list[dict[str, Any]], choice: Any, parallel: bool | None, chat_template: str | None,
               param: str = "tools", choice_param: str = "tool_choice") -> ToolPlan:
    """The request's tool plan; 400 for an unknown choice, a missing function, or a template without tools."""
    if tools and any(t.get("type") != "function" for t in tools):
        raise APIError(400, f"{param}: only type 'function' is supported", param)
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, f"{choice_param}: requires tools", choice_param)
        return NO_TOOLS
    for i, t in enumerate(tools):       # before templating or compiling them: depth, size, enums, patterns
        if t["function"].get("parameters") is not None:
            limits.check_schema(t["function"]["parameters"], f"{param}[{i}].function.parameters")
    names = [t["function"]["name"] for t in tools]
    if choice is None or choice == "auto":
        mode, allowed = "auto", names
    elif choice == "none":
        return NO_TOOLS
    elif choice == "required":
        mode, allowed = "required", names
    elif isinstance(choice, dict) and _named_choice(choice):
        mode, allowed = "named", [choice["function"]["name"]]
        if allowed[0] not in names:
            raise APIError(400, f"{choice_param}: function {allowed[0]!r} is not among tools {names}", choice_param)
    else:
        raise APIError(400, f"{choice_param}: must be none, auto, required or a named function", choice_param)
    if not chat_template or "tools" not in chat_template:
        raise APIError(400, f"{param}: this model's chat template does not support tools (it has no `tools` "
                       "variable); call without tools", param)
    plan = ToolPlan(mode, tools, parallel is not False)
    if mode in ("required", "named"):
        fns = [t["function"] for t in tools if t["function"]["name"] in allowed]
        schema = _call_schema(fns[0]) if len(fns) == 1 else {"anyOf": [_call_schema(f) for f in fns]}
        limits.check_schema(schema, param)      # all the tools' schemas together are one grammar
        plan.structured = StructuredSpec("tool_calls", json.dumps({"schema": schema, "parallel": plan.parallel}),
                                 choice_param)
    return plan


def _as_call(raw: str, names: set[str] | None = None) -> dict[str, Any] | None:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or (names is not None and obj["name"] not in names):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str, parallel: bool = True,
                     names: set[str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """(content outside the markup or None, calls) of a generated text. Without markup, a reply that is
    exactly one ``{"name": <a tool in names>, "arguments": ...}`` object (small models often drop the
    tags; fenced or not) is a call too."""
    calls = [c for c in (_as_call(m.group(1)) for m in _CALL.finditer(text)) if c is not None]
    if not calls and names:
        bare = _as_call(_FENCE.sub("", text.strip()).strip(), names)
        return (None, [bare]) if bare is not None else (text, [])
    if not calls:
        return text, []
    content = text[:text.find(OPEN)].strip()
    return (content or None), (calls if parallel else calls[:1])


def split_reply(text: str, plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) of a finished reply under ``plan`` (no calls when the plan parses none)."""
    if not plan.parses:
        return text, []
    return parse_tool_calls(text, plan.parallel, plan.names)


def _held_back(text: str) -> int:
    """Length of the longest suffix of text that could start ``<tool_call>``."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0


class ToolTextStream:
    """One choice's streamed text under a plan: ``feed(delta)`` returns the text safe to send now (none
    once ``<tool_call>`` may have begun, or while the reply may be a bare JSON call); ``finish()``
    returns the rest of the content and the calls."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan, self.text, self.sent = plan, "", 0

    def feed(self, delta: str) -> str:
        self.text += delta
        if not self.plan.parses:
            safe = len(self.text)
        elif self.sent == 0 and self.text.lstrip()[:1] in ("{", "`"):
            safe = 0                    # may be a bare {"name", "arguments"} call: held until the end
        else:
            cut = self.text.find(OPEN)
            safe = cut if cut >= 0 else len(self.text) - _held_back(self.text)
        piece = self.text[self.sent:max(safe, self.sent)]
        self.sent = max(safe, self.sent)
        return piece

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content not sent yet, calls)."""
        content, calls = split_reply(self.text, self.plan)
        if not calls:
            rest, self.sent = self.text[self.sent:], len(self.text)
            return rest, []
        rest = (content or "")[self.sent:] if content and len(content) > self.sent else ""
        return rest, calls


def with_tools(spec: StructuredSpec | None, plan: ToolPlan) -> StructuredSpec | None:
    """The one constraint of a request: its structured output, or its tool plan's (not both)."""
    if plan.structured is None:
        return spec
    if spec is not None:
        raise APIError(400, f"{spec.param}: cannot be combined with tool_choice {plan.mode!r}", spec.param)
    return plan.structured


def call_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A parsed call's arguments as an object (they are a JSON string in OpenAI's form)."""
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except (json.JSONDecodeError, RecursionError):
        return {}
    return args if isinstance(args, dict) else {"value": args}


class ToolFunction(_Nested):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class Tool(_Nested):
    type: str = "function"
    function: ToolFunction


@dataclass
class Reply:
    content: str
    calls: list[dict[str, Any]]               # {"id", "type": "function", "function": {"name", "arguments"}}
    finish_reason: str                        # "stop" | "length"
    stop_reason: int | str | None             # the matched stop string or token id
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    metrics: Any = None                       # RequestMetricsSnapshot

    @classmethod
    def of(cls, out: RequestOutput, plan: ToolPlan,
           parsed: tuple[str | None, list[dict[str, Any]]] | None = None) -> Reply:
        """``parsed``: (content, calls) already split out of the text (a stream's), else split here."""
        c = out.outputs[0]
        content, calls = parsed if parsed is not None else split_reply(c.text, plan)
        return cls(content or "", calls, c.finish_reason if c.finish_reason in ("stop", "length") else "stop",
                   c.stop_reason, len(out.prompt_token_ids), len(c.token_ids), out.num_cached_tokens,
                   list(c.token_ids), list(out.prompt_token_ids), c.logprobs, out.metrics)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def stop_string(self) -> str | None:
        return self.stop_reason if isinstance(self.stop_reason, str) else None


@dataclass
class Piece:
    text: str
    logprobs: list[PositionLogprobs] = field(default_factory=list)


@dataclass
class Done:
    reply: Reply


async def reply_events(src: Source, plan: ToolPlan) -> AsyncIterator[Piece | Done]:
    """Pieces of the reply's text as they become safe to send, then Done."""
    ts = ToolTextStream(plan)
    async for _, out in src:
        c = out.outputs[0]
        piece = ts.feed(c.delta_text)
        if piece or c.delta_logprobs:
            yield Piece(piece, list(c.delta_logprobs or []))
        if out.finished:
            rest, calls = ts.finish()
            if rest:
                yield Piece(rest)
            content = split_reply(ts.text, plan)[0] if calls else ts.text
            yield Done(Reply.of(out, plan, (content, calls)))
            return
