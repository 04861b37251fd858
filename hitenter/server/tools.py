"""Tool calling: tools rendered through the model's own chat template (its ``tools`` variable), the
model's ``<tool_call>{json}</tool_call>`` markup (Qwen2.5 / Hermes) parsed into OpenAI ``tool_calls``.

``tool_choice``: ``none`` renders no tools and parses nothing; ``auto`` (the default with tools) lets
the model decide; ``required`` and a named function constrain generation (structured outputs) to
``<tool_call>`` blocks whose JSON is ``{"name": <one of the allowed functions>, "arguments": <its
parameters schema>}``. ``parallel_tool_calls: false`` allows (and keeps) one call. A template that has
no ``tools`` variable (SmolLM2's) -> 400.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hitenter.engine.structured import GuidedSpec
from hitenter.server.protocol import APIError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolPlan:
    mode: str                                   # "none" | "auto" | "required" | "named"
    tools: list[dict[str, Any]] = field(default_factory=list)
    parallel: bool = True
    guided: GuidedSpec | None = None

    @property
    def parses(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def template_kwargs(self) -> dict[str, Any]:
        return {"tools": self.tools} if self.parses else {}


def message_tool_fields(tool_calls: list[dict[str, Any]] | None, tool_call_id: str | None) -> dict[str, Any]:
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
                try:
                    fn["arguments"] = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError as e:
                    raise APIError(400, f"messages: tool call arguments are not JSON: {e}", "messages") from e
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


def plan_tools(req: Any, chat_template: str | None) -> ToolPlan:
    """The request's tool plan; 400 for an unknown choice, a missing function, or a template without tools."""
    tools = [t.model_dump(exclude_none=True) for t in (req.tools or [])]
    choice = req.tool_choice
    if tools and any(t.get("type") != "function" for t in tools):
        raise APIError(400, "tools: only type 'function' is supported", "tools")
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice: requires tools", "tool_choice")
        return ToolPlan("none")
    names = [t["function"]["name"] for t in tools]
    if choice is None or choice == "auto":
        mode, allowed = "auto", names
    elif choice == "none":
        return ToolPlan("none")
    elif choice == "required":
        mode, allowed = "required", names
    elif isinstance(choice, dict) and _named_choice(choice):
        mode, allowed = "named", [choice["function"]["name"]]
        if allowed[0] not in names:
            raise APIError(400, f"tool_choice: function {allowed[0]!r} is not among tools {names}", "tool_choice")
    else:
        raise APIError(400, "tool_choice: must be none, auto, required or {type: function, function: {name}}",
                       "tool_choice")
    if not chat_template or "tools" not in chat_template:
        raise APIError(400, "tools: this model's chat template does not support tools (it has no `tools` "
                       "variable); call without tools", "tools")
    parallel = req.parallel_tool_calls is not False
    plan = ToolPlan(mode, tools, parallel)
    if mode in ("required", "named"):
        fns = [t["function"] for t in tools if t["function"]["name"] in allowed]
        schema = _call_schema(fns[0]) if len(fns) == 1 else {"anyOf": [_call_schema(f) for f in fns]}
        plan.guided = GuidedSpec("tool_calls", json.dumps({"schema": schema, "parallel": parallel}),
                                 "tool_choice")
    return plan


def _as_call(raw: str, names: set[str] | None = None) -> dict[str, Any] | None:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or (names is not None and obj["name"] not in names):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str, parallel: bool = True,
                     names: set[str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """(content outside the markup or None, OpenAI tool_calls) of a generated text. Without markup, a
    reply that is exactly one ``{"name": <a tool in names>, "arguments": ...}`` object (small models
    often drop the tags; fenced or not) is a call too."""
    calls = [c for c in (_as_call(m.group(1)) for m in _CALL.finditer(text)) if c is not None]
    if not calls and names:
        bare = _as_call(_FENCE.sub("", text.strip()).strip(), names)
        return (None, [bare]) if bare is not None else (text, [])
    if not calls:
        return text, []
    content = text[:text.find(OPEN)].strip()
    return (content or None), (calls if parallel else calls[:1])


def rewrite_chat_body(body: dict[str, Any], plan: ToolPlan) -> dict[str, Any]:
    for ch in body["choices"]:
        content, calls = parse_tool_calls(ch["message"]["content"] or "", plan.parallel, plan.names)
        if calls:
            ch["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
            ch["finish_reason"] = "tool_calls"
    return body


def _held_back(text: str) -> int:
    """Length of the longest suffix of text that could start ``<tool_call>``."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0


async def stream_tool_calls(chunks: AsyncIterator[dict[str, Any]], plan: ToolPlan) -> AsyncIterator[dict[str, Any]]:
    """Content deltas pass until ``<tool_call>`` may begin; at the finish the calls follow as
    ``tool_calls`` deltas (one per call, with its whole arguments) and finish_reason ``tool_calls``."""
    text: dict[int, str] = {}
    sent: dict[int, int] = {}
    async for chunk in chunks:
        if not chunk.get("choices"):
            yield chunk
            continue
        ch = chunk["choices"][0]
        i = ch["index"]
        delta = ch.get("delta", {})
        if "role" in delta:
            yield chunk
            continue
        text[i] = text.get(i, "") + delta.get("content", "")
        full, done = text[i], sent.get(i, 0)
        cut = full.find(OPEN)
        safe = (cut if cut >= 0 else len(full) - _held_back(full)) if not ch.get("finish_reason") else len(full)
        if not ch.get("finish_reason") and done == 0 and full.lstrip()[:1] in ("{", "`"):
            safe = 0          # may be a bare {"name", "arguments"} call: held until the end
        if ch.get("finish_reason"):
            content, calls = parse_tool_calls(full, plan.parallel, plan.names)
            if calls:
                pre = (content or "")[done:] if content and len(content) > done else ""
                new_delta: dict[str, Any] = {"content": pre} if pre else {}
                new_delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(calls)]
                yield {**chunk, "choices": [{**ch, "delta": new_delta, "finish_reason": "tool_calls"}]}
                continue
        piece = full[done:max(safe, done)]
        sent[i] = max(safe, done)
        if piece or ch.get("finish_reason") or ch.get("logprobs"):
            yield {**chunk, "choices": [{**ch, "delta": {"content": piece} if piece else {}}]}
