"""Ollama's generation API on the same port: POST /api/chat and /api/generate, streamed as NDJSON by
default (``"stream": false`` for one object), with Ollama's final statistics (``stats``).

- chat: messages (system / user / assistant with ``tool_calls`` / tool results), ``tools`` (the
  model decides: Ollama has no tool_choice), ``format`` ``"json"`` or a JSON schema (structured
  outputs), ``options`` (``Options``), ``logprobs`` / ``top_logprobs``;
- generate: ``prompt`` through the chat template with ``system`` (``raw``: as it is), ``context`` (the
  ids an earlier reply returned, continued), ``suffix`` where the model has fill-in-the-middle tokens;
- an empty chat / prompt loads the model (``done_reason: "load"``), with ``keep_alive`` 0 unloads it
  (``"unload"``), as Ollama does.

Ollama's response bodies and NDJSON streams for /api/chat and /api/generate, built from a Reply.

Every final object carries Ollama's statistics in nanoseconds: ``total_duration`` (the HTTP request's
start to now), ``load_duration`` (its start to the engine's arrival: loading the model when it was not
resident, templating and tokenizing), ``prompt_eval_count`` / ``prompt_eval_duration`` (the prompt's
tokens, arrival to the first generated token), ``eval_count`` / ``eval_duration`` (generated tokens,
first to last). Tool calls are ``{"function": {"name", "arguments": {...}}}`` (arguments an object).

Ollama's request bodies (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/show) and its
``options``, mapped onto SamplingParams.

Strict like every surface here: an unknown field or option is a 400 that names it, numbers are strict.
Defaults are Ollama's documented ones (temperature 0.8, top_k 40, top_p 0.9, num_predict -1: until the
window ends), except ``repeat_penalty``, 1.0 here: hitenter's repetition penalty counts the whole
sequence, Ollama's 1.1 the last 64 tokens only (``repeat_last_n`` is accepted as -1, the whole context,
only). ``num_ctx`` narrows the request's window (at most the server's ``--max-model-len``: a larger one
is a 400, never silently cut). ``keep_alive`` (a number of seconds or a Go duration, negative: forever)
is how long the model stays loaded after the request (hitenter/server/model_manager.py; the models the
server started with stay regardless). Images are refused (400): no served model takes them. ``think``
(true / false / a level) switches thinking through the template (chat_format.py); a reply's thinking
comes back as ``message.thinking`` (``thinking`` on /api/generate), streamed too; ``think`` is a 400
for a model without thinking.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from annotated_types import Interval, MinLen
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, model_validator

from hitenter.engine.image_prompt import with_prefix
from hitenter.outputs import PositionLogprobs
from hitenter.sampling_params import SamplingParams, StructuredSpec
from hitenter.server import structured_fields as SF
from hitenter.server.api_error import APIError, SafeJSONResponse, error_responses, overflow_error
from hitenter.server.chat_format import chat_format_of
from hitenter.server.generation import (
    NDJSON,
    ServedModel,
    ServerState,
    Source,
    State,
    chat_ids,
    check_ids,
    encode,
    respond,
    sampling_params,
    submit,
)
from hitenter.server.keep_alive import parse_keep_alive
from hitenter.server.model_manager import DEFAULT, UnknownModel
from hitenter.server.protocol_openai import Tool
from hitenter.server.reply import (
    NO_TOOLS,
    CallDone,
    CallPiece,
    Done,
    Piece,
    Reply,
    ToolPlan,
    bind,
    call_arguments,
    plan_tools,
    reply_events,
    reply_params,
    thinking_budget,
    with_tools,
)
from hitenter.server.schema_types import (
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


Temperature = Annotated[float, Interval(ge=0, le=100), STRICT]


NumPredict = Annotated[int, Interval(ge=-2), STRICT]


KeepAlive = Annotated[float, STRICT] | str


class Options(BaseModel):
    """Ollama's ``options`` that this server implements; any other option with a value is a 400 naming it
    (one sent as null is unset, as clients such as LangChain's send every option they know)."""
    temperature: Temperature | None = None
    top_k: TopK | None = None
    top_p: Fraction | None = None
    min_p: Fraction | None = None
    seed: Seed | None = None
    num_predict: NumPredict | None = None
    stop: list[NonEmpty] | None = None
    num_ctx: PositiveInt | None = None
    repeat_penalty: PositiveFloat | None = None
    repeat_last_n: Annotated[int, Interval(ge=-1, le=-1), STRICT] | None = None   # -1: the whole context
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        if isinstance(data, dict):
            extra = sorted(k for k, v in data.items() if k not in SUPPORTED and v is not None)
            if extra:
                raise ValueError(f"unsupported option(s) {extra}; this server implements {list(SUPPORTED)}")
            data = {k: v for k, v in data.items() if k in SUPPORTED}
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
    index: Annotated[int, Interval(ge=0), STRICT] | None = None


class ToolCall(_Nested):
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


class Message(_Nested):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[Any] | None = None                                  # base64 images (server/image_chat.py)
    thinking: str | None = None                                      # an earlier turn's thinking
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


NS = 1_000_000_000


def created_at() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(seconds: float | None) -> int:
    return max(0, int((seconds or 0.0) * NS))


def stats(reply: Reply, t0: float) -> dict[str, Any]:
    """Ollama's counts and durations of a finished reply; ``t0``: time.monotonic() at the request's start."""
    m = reply.metrics
    arrival = m.arrival_time if m is not None else t0
    first = arrival + (m.time_to_first_token or 0.0) if m is not None else t0
    last = (m.finished_time or time.monotonic()) if m is not None else time.monotonic()
    return {"total_duration": _ns(time.monotonic() - t0), "load_duration": _ns(arrival - t0),
            "prompt_eval_count": reply.prompt_tokens, "prompt_eval_duration": _ns(first - arrival),
            "eval_count": reply.completion_tokens, "eval_duration": _ns(last - first)}


def tool_calls(calls: list[dict[str, Any]], first: int = 0) -> list[dict[str, Any]]:
    """Calls in Ollama's form; ``first``: the index of the first (a stream sends them one by one)."""
    return [{"id": c["id"], "function": {"index": i, "name": c["function"]["name"], "arguments": call_arguments(c)}}
            for i, c in enumerate(calls, first)]


def logprobs(positions: list[PositionLogprobs], token_bytes: Any) -> list[dict[str, Any]]:
    def one(tid: int, tok: str, lp: float) -> dict[str, Any]:
        return {"token": tok, "logprob": lp if math.isfinite(lp) else -9999.0, "bytes": list(token_bytes(tid))}
    return [{**one(p.chosen.token_id, p.chosen.token, p.chosen.logprob),
             "top_logprobs": [one(t.token_id, t.token, t.logprob) for t in p.top]} for p in positions]


def _head(model: str) -> dict[str, Any]:
    return {"model": model, "created_at": created_at()}


def _done_fields(reply: Reply, t0: float) -> dict[str, Any]:
    return {"done": True, "done_reason": "length" if reply.truncated else "stop", **stats(reply, t0)}


def _thinking(state: ServerState, m: ServedModel, think_vars: dict[str, Any]) -> tuple[bool, int | None]:
    """Whether the prompt lets the reply think, and the server's budget for it (Ollama has no per-request one)."""
    return chat_format_of(m.tokenizer).thinking_on(think_vars), thinking_budget(state.reasoning_budget, None)


def think_kwargs(m: ServedModel, think: bool | str | None) -> dict[str, Any]:
    """The template variables of ``think`` (true / false / a level); 400 when the model has no thinking."""
    fmt = chat_format_of(m.tokenizer)
    if think not in (None, False) and not fmt.thinks:
        raise APIError(400, f"think: the model `{m.name}` does not support thinking; omit it or send false", "think")
    return fmt.template_kwargs(None if think is None else think is not False,
                               think if isinstance(think, str) else None)


def chat_message(reply: Reply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        msg["thinking"] = reply.reasoning
    if reply.calls:
        msg["tool_calls"] = tool_calls(reply.calls)
    return msg


def chat_body(model: str, reply: Reply, t0: float, token_bytes: Any = None) -> dict[str, Any]:
    body = {**_head(model), "message": chat_message(reply), **_done_fields(reply, t0)}
    if token_bytes is not None:
        body["logprobs"] = logprobs(reply.logprobs or [], token_bytes)
    return body


def generate_body(model: str, reply: Reply, t0: float, token_bytes: Any = None) -> dict[str, Any]:
    body = {**_head(model), "response": reply.content, **_done_fields(reply, t0),
            "context": reply.prompt_token_ids + reply.token_ids}
    if reply.reasoning:
        body["thinking"] = reply.reasoning
    if token_bytes is not None:
        body["logprobs"] = logprobs(reply.logprobs or [], token_bytes)
    return body


async def chat_stream(src: Source, model: str, plan: ToolPlan, t0: float,
                      token_bytes: Any = None) -> AsyncIterator[dict[str, Any]]:
    """One object per text piece (``message.content`` a delta), one per tool call as soon as it is
    complete (Ollama sends calls whole), then the final one (``done``, statistics) with empty content."""
    async for ev in reply_events(src, plan):
        if isinstance(ev, CallPiece):
            continue                                # Ollama sends calls whole
        if isinstance(ev, CallDone):
            yield {**_head(model), "message": {"role": "assistant", "content": "",
                                               "tool_calls": tool_calls([ev.call], ev.index)}, "done": False}
            continue
        if isinstance(ev, Piece):
            msg = {"role": "assistant", "content": "", "thinking": ev.text} if ev.reasoning else \
                {"role": "assistant", "content": ev.text}
            chunk = {**_head(model), "message": msg, "done": False}
            if token_bytes is not None:
                chunk["logprobs"] = logprobs(ev.logprobs, token_bytes)
            yield chunk
            continue
        assert isinstance(ev, Done)
        yield {**_head(model), "message": {"role": "assistant", "content": ""}, **_done_fields(ev.reply, t0)}


async def generate_stream(src: Source, model: str, plan: ToolPlan, t0: float,
                          token_bytes: Any = None) -> AsyncIterator[dict[str, Any]]:
    """One object per text piece (``response`` a delta), then the final one with ``context``."""
    async for ev in reply_events(src, plan):
        if isinstance(ev, CallPiece | CallDone):
            continue
        if isinstance(ev, Piece):
            chunk = {**_head(model), "response": "", "thinking": ev.text, "done": False} if ev.reasoning else \
                {**_head(model), "response": ev.text, "done": False}
            if token_bytes is not None:
                chunk["logprobs"] = logprobs(ev.logprobs, token_bytes)
            yield chunk
            continue
        assert isinstance(ev, Done)
        r = ev.reply
        yield {**_head(model), "response": "", **_done_fields(r, t0), "context": r.prompt_token_ids + r.token_ids}


router = APIRouter(responses=error_responses(400, 404, 413, 429))


_OK = {200: {"content": {"application/json": {}, "application/x-ndjson": {}},
             "description": "The reply, or (the default) its NDJSON stream"}}


_FIM = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"), ("<PRE>", "<SUF>", "<MID>"))


def keep_alive_of(value: float | str | None) -> object:
    """A request's ``keep_alive`` in seconds (None: forever; model_manager.DEFAULT when not given);
    400 naming it when it is not a number or a duration."""
    if value is None:
        return DEFAULT
    try:
        return parse_keep_alive(value)
    except ValueError as e:
        raise APIError(400, f"keep_alive: {e}", "keep_alive") from e


async def model_of(state: ServerState, name: str, keep_alive: float | str | None = None) -> ServedModel:
    """The model of an Ollama name (``tiny`` or ``tiny:latest``), loaded if need be and held for this
    request (``keep_alive``: how long it stays after); 404 in Ollama's words."""
    try:
        return await state.manager.acquire(base_name(name), keep_alive_of(keep_alive))
    except UnknownModel:
        raise APIError(404, f"model '{name}' not found, try pulling it first; served: {state.servable()}",
                       "model") from None


async def _load_or_unload(state: ServerState, model: str, key: str, keep_alive: float | str | None) -> Response:
    """An empty request: Ollama loads the model (``done_reason: "load"``), or with keep_alive 0 unloads it
    (``"unload"``: at once when idle, else when its requests end) and answers at once."""
    ka = keep_alive_of(keep_alive)
    if ka == 0:
        if not await state.manager.unload(base_name(model)) and not await state.manager.knows(base_name(model)):
            raise APIError(404, f"model '{model}' not found; served: {state.servable()}", "model")
        reason = "unload"
    else:
        await model_of(state, model, keep_alive)
        reason = "load"
    empty = {"role": "assistant", "content": ""} if key == "message" else ""
    return SafeJSONResponse({"model": model, "created_at": created_at(), key: empty, "done": True,
                             "done_reason": reason})


def fim_tokens(tok: Any) -> tuple[int, int, int] | None:
    """(prefix, suffix, middle) special token ids of a fill-in-the-middle vocabulary, or None."""
    for names in _FIM:
        ids = [tok.encode(n, add_bos=False) for n in names]
        if all(len(i) == 1 and tok.is_special(i[0]) for i in ids):
            return ids[0][0], ids[1][0], ids[2][0]
    return None


def _format_spec(fmt: str | dict[str, Any] | None) -> StructuredSpec | None:
    if fmt in (None, ""):
        return None
    return SF.json_spec("format") if fmt == "json" else SF.schema_spec(fmt, "format")


def _refuse_unsupported(req: ChatRequest | GenerateRequest) -> None:
    if isinstance(req, GenerateRequest) and req.images and (req.raw or req.suffix):
        raise APIError(400, "images: not taken with raw or suffix (images go through the chat template)", "images")
    if isinstance(req, GenerateRequest) and req.template:
        raise APIError(400, "template: a custom prompt template is not supported (the model's own renders)",
                       "template")


def _params(m: ServedModel, req: ChatRequest | GenerateRequest, prompt: list[int], spec: StructuredSpec | None,
            param: str) -> SamplingParams:
    """SamplingParams from ``options`` (Ollama's defaults), ``num_ctx`` narrowing the window."""
    opts = req.options or Options()
    try:
        kw = opts.sampling_kwargs()
    except ValueError as e:
        raise APIError(400, f"options.{e}", "options.num_predict") from e
    if opts.num_ctx is not None:
        if opts.num_ctx > m.max_model_len:
            raise APIError(400, f"options.num_ctx: {opts.num_ctx} is larger than this server's window of "
                           f"{m.max_model_len} tokens (start it with a larger --max-model-len)", "options.num_ctx")
        room = opts.num_ctx - len(prompt)
        if room < 1 or (kw["max_tokens"] or 0) > room:
            raise overflow_error(param, len(prompt), opts.num_ctx, kw["max_tokens"])
        kw["max_tokens"] = kw["max_tokens"] or room
    lp = (req.top_logprobs or 0) if req.logprobs else None
    return sampling_params(lambda: SamplingParams(**kw, logprobs=lp, structured=spec))


def _answered_call(earlier: list[dict[str, Any]]) -> str:
    """The id of the call a tool message without one answers: the next unanswered call of the latest
    assistant turn (Ollama sends results in the calls' order; some templates need the ids paired)."""
    results = 0
    for d in reversed(earlier):
        if d["role"] == "tool":
            results += 1
            continue
        calls = d.get("tool_calls") or []
        return calls[results]["id"] if results < len(calls) else ""
    return ""


def chat_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """Ollama messages as the chat template takes them (tool calls with object arguments; a call without
    an id gets a 9-character one, the form Mistral's templates insist on, and its result the same)."""
    out = []
    for i, msg in enumerate(req.messages):
        d: dict[str, Any] = {"role": msg.role, "content": msg.content}
        if msg.images:
            d["images"] = list(msg.images)
        if msg.thinking:
            d["reasoning_content"] = msg.thinking
        if msg.tool_calls:
            d["tool_calls"] = [{"id": tc.id or f"c{i:04d}{j:04d}", "type": "function",
                                "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                               for j, tc in enumerate(msg.tool_calls)]
        if msg.role == "tool":
            if msg.tool_name:
                d["name"] = msg.tool_name
            d["tool_call_id"] = msg.tool_call_id or _answered_call(out)
        out.append(d)
    return out


@router.post("/api/chat", responses=_OK)
async def chat(req: ChatRequest, request: Request, state: State) -> Response:
    t0 = time.monotonic()
    _refuse_unsupported(req)
    if not req.messages:
        return await _load_or_unload(state, req.model, "message", req.keep_alive)
    m = await model_of(state, req.model, req.keep_alive)
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    plan = plan_tools(tools, None, None, m.tokenizer.chat_template) if tools else NO_TOOLS
    spec = with_tools(_format_spec(req.format), plan)
    think_vars = think_kwargs(m, req.think)
    prompt = await chat_ids(state, m, chat_format_of(m.tokenizer).with_reasoning(chat_messages(req)), True,
                            **{**think_vars, **plan.template_kwargs()})
    plan = bind(plan, m.tokenizer, prompt, *_thinking(state, m, think_vars))
    params = reply_params(_params(m, req, prompt, spec, "messages"), plan)
    handles = await submit(m, [prompt], params, "messages")
    tb = m.tokenizer.token_bytes if req.logprobs else None
    return await respond(request, state, m, handles, req.stream,
                         lambda src: chat_stream(src, req.model, plan, t0, tb),
                         lambda outs: chat_body(req.model, Reply.of(outs[0], plan), t0, tb), NDJSON)


async def generate_ids(state: ServerState, m: ServedModel, req: GenerateRequest) -> list[int]:
    """The prompt's ids: fill-in-the-middle with a suffix, as written when raw, else through the chat
    template (with ``system``); an earlier reply's ``context`` first."""
    if req.suffix:
        fim = fim_tokens(m.tokenizer)
        if fim is None:
            raise APIError(400, f"suffix: the model `{m.name}` has no fill-in-the-middle tokens", "suffix")
        pre, suf = await encode(m, req.prompt, "prompt", False), await encode(m, req.suffix, "suffix", False)
        ids = [fim[0], *pre, fim[1], *suf, fim[2]]
    elif req.raw or m.client.info.toy or not m.tokenizer.chat_template:
        ids = await encode(m, req.prompt, "prompt", None if not req.context else False)
    else:
        msgs = ([{"role": "system", "content": req.system}] if req.system else []) + [
            {"role": "user", "content": req.prompt, **({"images": list(req.images)} if req.images else {})}]
        ids = await chat_ids(state, m, msgs, True, param="prompt", **think_kwargs(m, req.think))
    ids = with_prefix(list(req.context or []), ids)
    check_ids(m, ids, "prompt")
    return ids


@router.post("/api/generate", responses=_OK)
async def generate(req: GenerateRequest, request: Request, state: State) -> Response:
    t0 = time.monotonic()
    _refuse_unsupported(req)
    if not req.prompt and not req.suffix and not req.context:
        return await _load_or_unload(state, req.model, "response", req.keep_alive)
    m = await model_of(state, req.model, req.keep_alive)
    check_ids(m, list(req.context or []), "context")
    if not req.prompt and not req.suffix:
        return SafeJSONResponse({"model": req.model, "created_at": created_at(), "response": "", "done": True,
                                 "done_reason": "load"})
    if req.think not in (None, False) and (req.raw or req.suffix):
        raise APIError(400, "think: not with raw or suffix (no chat template renders the prompt)", "think")
    prompt = await generate_ids(state, m, req)
    plan = bind(NO_TOOLS, m.tokenizer, prompt, *_thinking(state, m, think_kwargs(m, req.think))) \
        if not (req.raw or req.suffix) else NO_TOOLS
    params = reply_params(_params(m, req, prompt, _format_spec(req.format), "prompt"), plan)
    handles = await submit(m, [prompt], params, "prompt")
    tb = m.tokenizer.token_bytes if req.logprobs else None
    return await respond(request, state, m, handles, req.stream,
                         lambda src: generate_stream(src, req.model, plan, t0, tb),
                         lambda outs: generate_body(req.model, Reply.of(outs[0], plan), t0, tb), NDJSON)
