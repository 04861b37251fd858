"""OpenAI Responses: POST /v1/responses (string or item input, ``instructions``, function tools and
their outputs, ``text.format`` json_schema / json_object, ``max_output_tokens``, ``temperature`` /
``top_p``, logprobs with ``include: ["message.output_text.logprobs"]`` + ``top_logprobs``, streaming as
named server-sent events), ``previous_response_id`` against the bounded in-memory store
(responses_store.py; ``store: false`` keeps nothing), GET and DELETE /v1/responses/{id}.
Defaults are OpenAI's: temperature 1, top_p 1, ``max_output_tokens`` the rest of the window.

OpenAI Responses' response object and its event stream, built from a Reply.

Output items: one ``message`` (``output_text`` part) unless the reply is only tool calls, then one
``function_call`` per call. ``status`` is ``completed``, or ``incomplete`` with ``incomplete_details.reason
= "max_output_tokens"`` when the budget ran out. The stream follows the documented sequence, each event
with its ``sequence_number``: ``response.created``, ``response.in_progress``; for the message
``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``...,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``; for each
call ``response.output_item.added`` as soon as its name is parsed, ``response.function_call_arguments.delta``
as its arguments are written (per format: the JSON formats member by member, the XML formats
parameter by parameter, a bare JSON reply when it ends), ``.done`` and ``response.output_item.done`` when it is complete. One item is
open at a time: text after a call opens a second message item. Then ``response.completed`` (or ``response.incomplete``) with the whole
response, whose items carry the same ids as the events did.

The request body is in protocol_responses.py, the stored responses in responses_store.py.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.outputs import PositionLogprobs
from hitenter.sampling_params import SamplingParams, StructuredSpec
from hitenter.server import structured_fields as SF
from hitenter.server.api_error import APIError, error_responses
from hitenter.server.chat_format import chat_format_of
from hitenter.server.generation import (
    NAMED_SSE_OPENAI,
    ServerState,
    Source,
    State,
    chat_ids,
    new_id,
    now,
    respond,
    sampling_params,
    submit,
)
from hitenter.server.protocol_openai import message_tool_fields
from hitenter.server.protocol_responses import (
    FunctionCallItem,
    Item,
    MessageItem,
    ReasoningInputItem,
    ResponsesRequest,
    TextConfig,
)
from hitenter.server.reply import (
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
from hitenter.server.responses_store import ResponseStore
from hitenter.server.serving_chat import chat_logprobs
from hitenter.server.tool_parsers import ToolDelta

# Responses' field -> SamplingParams' (a field left out keeps SamplingParams' default, except DEFAULTS)
SAMPLING = {"max_output_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p"}
DEFAULTS = {"temperature": 1.0, "top_p": 1.0}          # OpenAI's documented defaults


def sampling_kwargs(req: ResponsesRequest) -> dict[str, Any]:
    """The request's sampling fields as SamplingParams' keywords (SAMPLING), validated once by
    SamplingParams (generation.sampling_params turns its ValueError into a 400 naming the field)."""
    got = {ours: getattr(req, theirs) for theirs, ours in SAMPLING.items() if getattr(req, theirs) is not None}
    return {**DEFAULTS, **got}


def template_messages(items: list[Item]) -> list[dict[str, Any]]:
    """Input items as the chat template's messages: developer -> system; function calls join the
    assistant turn before them (or open one); outputs become ``tool`` messages; a reasoning item is the
    ``reasoning_content`` of the assistant turn its next item makes or joins (chat_format.with_reasoning
    hands it to the template under the names it reads); one followed by no assistant item is dropped."""
    out: list[dict[str, Any]] = []
    thought: str | None = None
    for item in items:
        if isinstance(item, ReasoningInputItem):
            thought = item.text() if thought is None else thought + item.text()
            continue
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": item.template_content()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "tool", "content": item.text(), "tool_call_id": item.call_id})
        if thought is not None and out[-1]["role"] == "assistant" and "reasoning_content" not in out[-1]:
            out[-1]["reasoning_content"] = thought
        thought = None
    for msg in out:
        if "tool_calls" in msg:
            msg.update(message_tool_fields(msg["tool_calls"], None, "input"))   # arguments as objects (400 if not JSON)
    return out


# (status, output items, usage or None, reply or None) -> the response object
Base = Callable[[str, list[dict[str, Any]], dict[str, Any] | None, Reply | None], dict[str, Any]]


Logprobs = Callable[[list[PositionLogprobs]], list[dict[str, Any]]]


def usage(r: Reply) -> dict[str, Any]:
    return {"input_tokens": r.prompt_tokens, "input_tokens_details": {"cached_tokens": r.cached_tokens},
            "output_tokens": r.completion_tokens, "output_tokens_details": {"reasoning_tokens": r.reasoning_tokens},
            "total_tokens": r.prompt_tokens + r.completion_tokens}


def logprobs_fn(token_bytes: Any, k: int | None) -> Logprobs:
    """The output_text ``logprobs`` of some positions (empty lists when they were not asked for)."""
    if k is None:
        return lambda _: []
    return lambda positions: chat_logprobs(positions, token_bytes, k)["content"] if positions else []


def text_part(text: str, lps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": lps}


def message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(call: dict[str, Any], item_id: str, status: str, arguments: str | None = None) -> dict[str, Any]:
    fn = call["function"]
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn["name"],
            "arguments": fn["arguments"] if arguments is None else arguments, "status": status}


def status_of(r: Reply) -> str:
    return "incomplete" if r.truncated else "completed"


def reasoning_item(item_id: str, text: str, encrypted: bool = False) -> dict[str, Any]:
    """A reasoning output item; ``encrypted`` (``include: ["reasoning.encrypted_content"]``): its
    ``encrypted_content`` too, which here is the text itself (nothing encrypts it; a client that keeps no
    store sends it back, and it goes back to the template)."""
    item = {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
    return {**item, "encrypted_content": text} if encrypted else item


def output_items(r: Reply, lps: Logprobs, encrypted: bool = False) -> list[dict[str, Any]]:
    items = [reasoning_item(new_id("rs", "_"), r.reasoning, encrypted)] if r.reasoning else []
    if r.content or not r.calls:
        items.append(message_item(new_id("msg", "_"), status_of(r), [text_part(r.content, lps(r.logprobs or []))]))
    items += [call_item(c, new_id("fc", "_"), "completed") for c in r.calls]
    return items


class _Events:
    def __init__(self) -> None:
        self.seq = itertools.count()

    def __call__(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(self.seq), **fields}


async def stream_events(src: Source, plan: ToolPlan, base: Base, lps: Logprobs,
                        encrypted: bool = False) -> AsyncIterator[dict[str, Any]]:
    """The documented event sequence of one response (see the module docstring): output items one after
    another (each done before the next is added): the reasoning item, the message, each function call
    as its name is known, its ``function_call_arguments.delta`` events as its arguments are written."""
    ev = _Events()
    yield ev("response.created", response=base("in_progress", [], None, None))
    yield ev("response.in_progress", response=base("in_progress", [], None, None))
    out, r = _Output(ev, lps, encrypted), None
    async for e in reply_events(src, plan):
        if isinstance(e, Done):
            r = e.reply
        for x in out.events(e):
            yield x
    assert r is not None
    status = status_of(r)
    yield ev(f"response.{status}", response=base(status, out.items, usage(r), r))


class _Output:
    """A response's output items as they stream (one open at a time)."""

    def __init__(self, ev: _Events, lps: Logprobs, encrypted: bool) -> None:
        self.ev, self.lps, self.encrypted = ev, lps, encrypted
        self.items: list[dict[str, Any]] = []
        self.kind: str | None = None               # the open item: reasoning | message | function_call
        self.id, self.body, self.body_lps = "", "", []
        self.call: dict[str, Any] = {}

    @property
    def at(self) -> int:
        return len(self.items)

    def events(self, e: Any) -> list[dict[str, Any]]:
        """The stream events of one reply event."""
        if isinstance(e, Piece):
            return [] if not e.text else self.reasoning(e.text) if e.reasoning else self.text(e.text, e.logprobs)
        if isinstance(e, CallPiece):
            return self.call_piece(e.delta)
        if isinstance(e, CallDone):
            return self.call_done(e.call)
        status = status_of(e.reply)
        out = self.close(status)
        if not any(i["type"] in ("message", "function_call") for i in self.items):   # an empty answer
            out += self.text("", []) + self.close(status)
        return out

    def _open(self, kind: str, item: dict[str, Any]) -> list[dict[str, Any]]:
        if self.kind == kind and kind != "function_call":
            return []
        out = self.close("completed")
        self.kind, self.id, self.body, self.body_lps = kind, item["id"], "", []
        return out + [self.ev("response.output_item.added", output_index=self.at, item=item)]

    def reasoning(self, text: str) -> list[dict[str, Any]]:
        out = self._open("reasoning", {**reasoning_item(new_id("rs", "_"), ""), "content": []})
        self.body += text
        return out + [self.ev("response.reasoning_text.delta", item_id=self.id, output_index=self.at, content_index=0,
                              delta=text)]

    def text(self, text: str, logprobs: list[Any]) -> list[dict[str, Any]]:
        out = []
        if self.kind != "message":
            out = self._open("message", message_item(new_id("msg", "_"), "in_progress", []))
            out.append(self.ev("response.content_part.added", item_id=self.id, output_index=self.at, content_index=0,
                               part=text_part("", [])))
        if not text:
            return out
        piece_lps = self.lps(logprobs)
        self.body, self.body_lps = self.body + text, self.body_lps + piece_lps
        return out + [self.ev("response.output_text.delta", item_id=self.id, output_index=self.at, content_index=0,
                              delta=text, logprobs=piece_lps)]

    def call_piece(self, d: Any) -> list[dict[str, Any]]:
        out = []
        if d.name is not None:
            self.call = {"id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""}}
            out = self._open("function_call", call_item(self.call, new_id("fc", "_"), "in_progress", ""))
        if d.arguments:
            self.body += d.arguments
            out.append(self.ev("response.function_call_arguments.delta", item_id=self.id, output_index=self.at,
                               delta=d.arguments))
        return out

    def call_done(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out = [] if self.kind == "function_call" and self.call.get("id") == call["id"] else \
            self.call_piece(ToolDelta(0, call["id"], call["function"]["name"], call["function"]["arguments"]))
        self.call = call
        return out + self.close("completed")

    def close(self, status: str) -> list[dict[str, Any]]:
        kind, i, self.kind = self.kind, self.at, None
        if kind == "reasoning":
            item = reasoning_item(self.id, self.body, self.encrypted)
            out = [self.ev("response.reasoning_text.done", item_id=self.id, output_index=i, content_index=0,
                           text=self.body)]
        elif kind == "message":
            part = text_part(self.body, self.body_lps)
            item = message_item(self.id, status, [part])
            out = [self.ev("response.output_text.done", item_id=self.id, output_index=i, content_index=0,
                           text=self.body, logprobs=self.body_lps),
                   self.ev("response.content_part.done", item_id=self.id, output_index=i, content_index=0, part=part)]
        elif kind == "function_call":
            item = call_item(self.call, self.id, "completed")
            out = [self.ev("response.function_call_arguments.done", item_id=self.id, output_index=i,
                           arguments=item["arguments"], name=item["name"])]
        else:
            return []
        self.items.append(item)
        return out + [self.ev("response.output_item.done", output_index=i, item=item)]


router = APIRouter(responses=error_responses(400, 404, 413, 429))


_OK = {200: {"content": {"application/json": {}, "text/event-stream": {}},
             "description": "The response, or with `stream` its server-sent events"}}


def store_of(state: ServerState) -> ResponseStore:
    return state.stores.setdefault("responses", ResponseStore())     # type: ignore[no-any-return]


def text_spec(text: TextConfig | None) -> StructuredSpec | None:
    f = text.format if text is not None else None
    if f is None or f.type == "text":
        return None
    if f.type == "json_object":
        return SF.json_spec("text.format")
    if f.schema_ is None:
        raise APIError(400, "text.format.schema: is required with type json_schema", "text.format.schema")
    return SF.schema_spec(f.schema_, "text.format")


def reply_messages(r: Reply) -> list[dict[str, Any]]:
    """The reply as the chat template's assistant turn (for a later previous_response_id)."""
    msg: dict[str, Any] = {"role": "assistant", "content": r.content}
    if r.reasoning:
        msg["reasoning_content"] = r.reasoning
    if r.calls:
        msg["tool_calls"] = [{**c, "function": {**c["function"], "arguments": call_arguments(c)}} for c in r.calls]
    return [msg]


def _echo(req: ResponsesRequest, params: SamplingParams) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else {"type": "text"}
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else (req.tool_choice or "auto")
    return {"instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None}, "store": req.store, "temperature": params.temperature,
            "text": {"format": fmt}, "tool_choice": choice,
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "top_logprobs": req.top_logprobs or 0,
            "top_p": params.top_p, "truncation": "disabled", "user": req.user, "metadata": req.metadata or {},
            "background": False, "service_tier": "default"}


@router.post("/v1/responses", responses=_OK)
async def create_response(req: ResponsesRequest, request: Request, state: State) -> Response:
    req.check()
    m, store = await state.model_for(req.model), store_of(state)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = store.get(req.previous_response_id)
        if prev is None:
            raise APIError(404, f"previous_response_id: no stored response {req.previous_response_id!r}",
                           "previous_response_id")
        history = prev.history
    new = template_messages(req.items())
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    tools = [t.as_openai() for t in req.tools or []]
    plan = plan_tools(tools, req.choice(), req.parallel_tool_calls, m.tokenizer.chat_template)
    spec = with_tools(text_spec(req.text), plan)
    fmt = chat_format_of(m.tokenizer)
    think, effort = req.reasoning.think() if req.reasoning else (None, None)
    think_vars = fmt.template_kwargs(think, effort)
    prompt = await chat_ids(state, m, fmt.with_reasoning(system + history + new), True, param="input",
                            **{**think_vars, **plan.template_kwargs()})
    plan = bind(plan, m.tokenizer, prompt, fmt.thinking_on(think_vars), thinking_budget(state.reasoning_budget, None))
    k = (req.top_logprobs or 0) if req.wants_logprobs() else None
    params = sampling_params(lambda: SamplingParams(**sampling_kwargs(req), logprobs=k, structured=spec))
    params = reply_params(params, plan)
    handles = await submit(m, [prompt], params, "input")
    rid, created, echo = new_id("resp", "_"), now(), _echo(req, params)

    def base(status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, r: Reply | None) -> dict[str, Any]:
        body = {"id": rid, "object": "response", "created_at": created, "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if r is not None and r.truncated else None,
                "model": m.name, "output": output, "usage": usage, **echo}
        if r is not None and req.store:
            store.put(body, history + new + reply_messages(r))
        return body

    lps, enc = logprobs_fn(m.tokenizer.token_bytes, k), "reasoning.encrypted_content" in (req.include or ())

    def build(outs: list[Any]) -> dict[str, Any]:
        r = Reply.of(outs[0], plan)
        return base(status_of(r), output_items(r, lps, enc), usage(r), r)

    return await respond(request, state, m, handles, req.stream, lambda src: stream_events(src, plan, base, lps, enc),
                         build, NAMED_SSE_OPENAI)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, state: State) -> dict[str, Any]:
    got = store_of(state).get(response_id)
    if got is None:
        raise APIError(404, f"no stored response {response_id!r}", "response_id")
    return got.body


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, state: State) -> dict[str, Any]:
    if not store_of(state).delete(response_id):
        raise APIError(404, f"no stored response {response_id!r}", "response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}
