"""OpenAI Responses: POST /v1/responses (string or item input, ``instructions``, function tools and
their outputs, ``text.format`` json_schema / json_object, ``max_output_tokens``, ``temperature`` /
``top_p``, logprobs with ``include: ["message.output_text.logprobs"]`` + ``top_logprobs``, streaming as
named server-sent events), ``previous_response_id`` against the bounded in-memory store
(responses_store.py; ``store: false`` keeps nothing), GET and DELETE /v1/responses/{id}.
Defaults are OpenAI's: temperature 1, top_p 1, ``max_output_tokens`` the rest of the window."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.engine.structured import GuidedSpec
from hitenter.sampling_params import SamplingParams
from hitenter.server import guided as G
from hitenter.server import responses_shapes as S
from hitenter.server.api_error import APIError
from hitenter.server.errors import error_responses
from hitenter.server.framing import NAMED_SSE_OPENAI
from hitenter.server.generation import respond, sampling_params, submit
from hitenter.server.reply import Reply
from hitenter.server.responses_protocol import ResponsesRequest, TextConfig, template_messages
from hitenter.server.responses_store import ResponseStore
from hitenter.server.schema_types import new_id, now
from hitenter.server.state import ServerState, State, chat_ids
from hitenter.server.tools import call_arguments, plan_tools, with_tools

router = APIRouter(responses=error_responses(400, 404, 413, 429))
_OK = {200: {"content": {"application/json": {}, "text/event-stream": {}},
             "description": "The response, or with `stream` its server-sent events"}}


def store_of(state: ServerState) -> ResponseStore:
    return state.stores.setdefault("responses", ResponseStore())     # type: ignore[no-any-return]


def text_spec(text: TextConfig | None) -> GuidedSpec | None:
    f = text.format if text is not None else None
    if f is None or f.type == "text":
        return None
    if f.type == "json_object":
        return G.json_spec("text.format")
    return G.schema_spec(f.schema_ or {"type": "object"}, "text.format")


def reply_messages(r: Reply) -> list[dict[str, Any]]:
    """The reply as the chat template's assistant turn (for a later previous_response_id)."""
    msg: dict[str, Any] = {"role": "assistant", "content": r.content}
    if r.calls:
        msg["tool_calls"] = [{**c, "function": {**c["function"], "arguments": call_arguments(c)}} for c in r.calls]
    return [msg]


def _echo(req: ResponsesRequest, params: SamplingParams) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else {"type": "text"}
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else (req.tool_choice or "auto")
    return {"instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": req.store, "temperature": params.temperature,
            "text": {"format": fmt}, "tool_choice": choice,
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "top_logprobs": req.top_logprobs or 0,
            "top_p": params.top_p, "truncation": "disabled", "user": req.user, "metadata": req.metadata or {},
            "background": False, "service_tier": "default"}


@router.post("/v1/responses", responses=_OK)
async def create_response(req: ResponsesRequest, request: Request, state: State) -> Response:
    req.check()
    m, store = state.model_for(req.model), store_of(state)
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
    prompt = await chat_ids(state, m, system + history + new, True, param="input", **plan.template_kwargs())
    k = (req.top_logprobs or 0) if req.wants_logprobs() else None
    params = sampling_params(lambda: SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature, top_p=1.0 if req.top_p is None else req.top_p,
        max_tokens=req.max_output_tokens, logprobs=k, guided=spec))
    handles = await submit(m, [prompt], params, "input")
    rid, created, echo = new_id("resp", "_"), now(), _echo(req, params)

    def base(status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, r: Reply | None) -> dict[str, Any]:
        body = {"id": rid, "object": "response", "created_at": created, "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if r is not None and r.truncated else None,
                "model": m.name, "output": output, "usage": usage, **echo}
        if r is not None and req.store:
            store.put(body, history + new + reply_messages(r))
        return body

    lps = S.logprobs_fn(m.tokenizer.token_bytes, k)

    def build(outs: list[Any]) -> dict[str, Any]:
        r = Reply.of(outs[0], plan)
        return base(S.status_of(r), S.output_items(r, lps), S.usage(r), r)

    return await respond(request, state, m, handles, req.stream, lambda src: S.stream_events(src, plan, base, lps),
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
