"""One assistant reply (one prompt, one choice) as the non-OpenAI-chat surfaces see it: Ollama's chat and
generate, OpenAI Responses and Anthropic Messages build their bodies and streams from this.

``Reply.of(out, plan)``: a finished RequestOutput split into reasoning, content and tool calls, with
its finish and token counts. ``reply_events(src, plan)``: a stream of ``Piece`` (content or reasoning
text safe to send now, the logprobs of the tokens it came from), ``CallPiece`` (a tool call's name,
then its argument text), ``CallDone`` (a call complete, as soon as its block closed) ending in one
``Done`` (the Reply); text that may still become markup is held back (chat_format.ReplyParser over the
model's reasoning and tool-call parsers).

Tool calling for every surface: tools rendered through the model's own chat template (its ``tools``
variable), the calls parsed out of the reply in the model's own markup (hitenter/server/tool_parsers/,
chosen from the template).

A surface turns its own spelling into ``plan_tools(tools, choice, parallel, chat_template)``:
``tools`` in OpenAI's ``{"type": "function", "function": {name, description, parameters}}`` form,
``choice`` one of ``none`` (render no tools, parse nothing), ``auto`` (the model decides), ``required``
or ``{"type": "function", "function": {"name": ...}}`` (generation constrained by a grammar to calls
of the allowed functions in the model's own markup, arguments following their parameters schema);
``parallel: False`` allows (and keeps) one call. A template without a ``tools`` variable
(SmolLM2's) -> 400.

Calls come back as ``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}``.
``bind(plan, tokenizer, prompt_ids, think, budget)`` gives a plan the model's chat format, the prompt's
end (whether the prompt opened the thinking section) and the thinking section for the engine (its
budget; a forced call's grammar waits for it to close); ``reply_params`` decodes with special tokens
where the model's markup is made of them and hands the engine that section. The tool definitions and
message tool fields of the request bodies are protocol_openai.py's.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.sampling_params import SamplingParams, StructuredSpec, ThinkingSpec
from hitenter.server import field_limits as limits
from hitenter.server.api_error import APIError
from hitenter.server.chat_format import ChatFormat, ReplyParser, Thought, chat_format_of
from hitenter.server.generation import Source
from hitenter.server.tool_parsers import ToolDelta, ToolParser, tool_parser_for
from hitenter.server.tool_parsers.hermes import HermesToolParser


@dataclass
class ToolPlan:
    mode: str                                   # "none" | "auto" | "required" | "named"
    tools: list[dict[str, Any]] = field(default_factory=list)
    parallel: bool = True
    structured: StructuredSpec | None = None
    parser: type[ToolParser] = HermesToolParser      # the model's tool-call markup
    fmt: ChatFormat | None = None                    # set by bind(): the model's chat format
    tail: str = ""                                   # ... and the end of the prompt's text
    token_texts: Any = None                          # ... and its token ids -> their texts (counting)
    thinking: ThinkingSpec | None = None             # ... and its thinking section for the engine (budget, gate)

    @property
    def parses(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def template_kwargs(self) -> dict[str, Any]:
        return {"tools": self.tools} if self.parses else {}

    def reply_parser(self) -> ReplyParser:
        """A fresh parser for one reply under this plan."""
        fmt = self.fmt
        reasoning = fmt.reasoning.parser(self.tail) if fmt is not None and fmt.reasoning is not None else None
        return ReplyParser(reasoning, self.parser(self.tools, self.parallel) if self.parses else None)

    @property
    def needs_special(self) -> bool:
        return self.reply_parser().needs_special


NO_TOOLS = ToolPlan("none")


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
    plan = ToolPlan(mode, tools, parallel is not False, parser=tool_parser_for(chat_template))
    if mode in ("required", "named"):
        fns = [t["function"] for t in tools if t["function"]["name"] in allowed]
        limits.check_schema({"anyOf": [f.get("parameters") or {} for f in fns]}, param)   # one grammar
        variants = plan.parser(tools).grammar(fns)
        plan.structured = StructuredSpec("tool_calls", json.dumps(
            {"variants": variants, "parallel": plan.parallel, "sep": plan.parser.sep}), choice_param)
    return plan


def bind(plan: ToolPlan, tokenizer: Any, prompt_ids: list[int], think: bool = False,
         budget: int | None = None) -> ToolPlan:
    """``plan`` for one prompt of a model: its chat format, and the prompt's end (which tells whether
    the template opened the thinking section). ``think``: the prompt lets the reply think; then the
    section is bounded by ``budget`` tokens (None: unbounded) and a forced call's grammar waits for
    it to close (as vLLM applies structured outputs after the reasoning ends)."""
    tail = tokenizer.decode(prompt_ids[-16:]) if prompt_ids else ""
    fmt = chat_format_of(tokenizer)
    thinking = fmt.thinking_spec(tokenizer, budget, plan.structured is not None) if think else None

    def token_texts(ids: list[int]) -> list[str]:
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return [dec.decode(tokenizer.token_bytes(t)) for t in ids]
    return dataclasses.replace(plan, fmt=fmt, tail=tail, token_texts=token_texts, thinking=thinking)


def reply_params(params: SamplingParams, plan: ToolPlan) -> SamplingParams:
    """``params`` decoding special tokens where the model's reasoning or call markup is made of them,
    with the plan's thinking section (its budget, the gate of a forced call)."""
    if plan.needs_special and params.skip_special_tokens:
        params = params.replace(skip_special_tokens=False)
    if plan.thinking is not None:
        params = params.replace(thinking=plan.thinking)
    return params


def thinking_budget(server_budget: int, requested: int | None) -> int | None:
    """A reply's thinking budget: the request's, else the server's (``--reasoning-budget``; -1: none)."""
    if requested is not None:
        return requested
    return server_budget if server_budget >= 0 else None


def parse_tool_calls(text: str, parallel: bool = True,
                     names: set[str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """(content outside the markup or None, calls) of a reply in Hermes ``<tool_call>`` markup; a reply
    that is exactly one ``{"name": <a tool in names>, "arguments": ...}`` object is a call too."""
    tools = [{"type": "function", "function": {"name": n}} for n in names or ()]
    p = HermesToolParser(tools, parallel)
    p.feed(text)
    p.finish()
    return (p.content or None) if p.calls else text, p.calls


def split_reply(text: str, plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) of a finished reply under ``plan`` (reasoning left out; see Reply.of)."""
    rp = plan.reply_parser()
    _, content, calls = rp.split(text)
    return (content or None) if calls else content, calls


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
    reasoning: str = ""                       # the thinking section's text
    reasoning_tokens: int = 0                 # tokens generated while thinking

    @classmethod
    def of(cls, out: RequestOutput, plan: ToolPlan, parsed: ReplyParser | None = None,
           reasoning_tokens: int | None = None) -> Reply:
        """``parsed``: the parser that already read the reply (a stream's), else it is read here."""
        c = out.outputs[0]
        if parsed is None:
            parsed = plan.reply_parser()
            parsed.split(c.text)
        calls = parsed.calls
        content = parsed.content.strip() if calls else parsed.content
        n = len(c.token_ids)
        thinking = reasoning_tokens if reasoning_tokens is not None else 0
        if reasoning_tokens is None and parsed.reasoning and plan.token_texts is not None:
            thinking = plan.reply_parser().count(plan.token_texts(list(c.token_ids)))
        return cls(content, calls, c.finish_reason if c.finish_reason in ("stop", "length") else "stop",
                   c.stop_reason, len(out.prompt_token_ids), n, out.num_cached_tokens,
                   list(c.token_ids), list(out.prompt_token_ids), c.logprobs, out.metrics,
                   parsed.reasoning_text, min(thinking, n))

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
    reasoning: bool = False                   # thinking text, not the answer


@dataclass
class CallPiece:
    delta: ToolDelta                          # a call's id and name (first), then argument text


@dataclass
class CallDone:
    call: dict[str, Any]                      # a call complete: {"id", "type", "function": {name, arguments}}
    index: int


@dataclass
class Done:
    reply: Reply


Event = Piece | CallPiece | CallDone


class _Calls:
    """Marks where each call of a reply is complete: a call is done once its block closed (the parser
    holds it in ``calls``) and the next event is not one of its pieces."""

    def __init__(self, rp: ReplyParser) -> None:
        self.rp, self.open, self.sent = rp, None, 0      # the call being streamed, calls marked done

    def before(self, event: Event) -> list[CallDone]:
        """The calls complete before ``event``: all of them, except the one ``event`` is a piece of."""
        if not isinstance(event, CallPiece):
            return self.flush()
        if event.delta.index == self.open:
            return []
        self.open = event.delta.index
        return self.flush(event.delta.index)

    def flush(self, upto: int | None = None) -> list[CallDone]:
        calls = self.rp.calls
        end = len(calls) if upto is None else min(upto, len(calls))
        out = [CallDone(calls[i], i) for i in range(self.sent, end)]
        self.sent = max(self.sent, end)
        return out


def _pieces(outs: list[Any], logprobs: list[PositionLogprobs], calls: _Calls) -> list[Event]:
    """Parser outputs as events, each call's CallDone right after its last piece; the step's logprobs
    ride on its first piece (or an empty one)."""
    events: list[Event] = []
    for o in outs:
        e: Event
        if isinstance(o, ToolDelta):
            e = CallPiece(o)
        elif isinstance(o, Thought):
            e = Piece(o.text, reasoning=True)
        elif o:
            e = Piece(o)
        else:
            continue
        events += calls.before(e)
        events.append(e)
    events += calls.flush()
    if logprobs:
        first = next((e for e in events if isinstance(e, Piece)), None)
        if first is None:
            events.insert(0, Piece("", logprobs))
        else:
            first.logprobs = logprobs
    return events


async def reply_events(src: Source, plan: ToolPlan) -> AsyncIterator[Event | Done]:
    """Pieces of the reply as they become safe to send (a call's ``CallDone`` as soon as it is
    complete), then Done. A step's tokens count as reasoning tokens while its text went to the
    thinking section."""
    rp = plan.reply_parser()
    calls = _Calls(rp)
    thinking = 0
    async for _, out in src:
        c = out.outputs[0]
        before = rp.in_thought
        outs = rp.feed(c.delta_text)
        if before or rp.in_thought or any(isinstance(o, Thought) for o in outs):
            thinking += len(c.delta_token_ids)
        for e in _pieces(outs, list(c.delta_logprobs or []), calls):
            yield e
        if out.finished:
            for e in _pieces(rp.finish(), [], calls):
                yield e
            yield Done(Reply.of(out, plan, rp, thinking))
            return
