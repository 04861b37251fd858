"""Anthropic Messages: POST /v1/messages (system, content blocks, ``max_tokens``, ``stop_sequences``,
temperature / top_p / top_k, tools with tool_use / tool_result blocks and ``tool_choice`` auto / any /
tool / none, ``output_config.format`` structured outputs, streaming as named server-sent events) and POST /v1/messages/count_tokens. Errors in
Anthropic's shape (api_error.dialect_of); the key may come as ``x-api-key``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.sampling_params import SamplingParams
from hitenter.server import guided as G
from hitenter.server import messages_shapes as S
from hitenter.server.errors import error_responses
from hitenter.server.framing import NAMED_SSE_ANTHROPIC
from hitenter.server.generation import respond, sampling_params, submit
from hitenter.server.messages_protocol import CountTokensRequest, MessagesRequest
from hitenter.server.reply import Reply
from hitenter.server.state import ServedModel, ServerState, State, chat_ids
from hitenter.server.tools import NO_TOOLS, ToolPlan, plan_tools, with_tools

router = APIRouter(responses=error_responses(400, 404, 413, 429))
_OK = {200: {"content": {"application/json": {}, "text/event-stream": {}},
             "description": "The message, or with `stream` its server-sent events"}}


def _plan(req: MessagesRequest | CountTokensRequest, template: str | None) -> ToolPlan:
    tools = req.tools_openai()
    if not tools and req.tool_choice is None:
        return NO_TOOLS
    choice = req.tool_choice.as_openai() if req.tool_choice is not None else None
    parallel = None if req.tool_choice is None else not req.tool_choice.disable_parallel_tool_use
    return plan_tools(tools, choice, parallel, template)


async def _prompt(state: ServerState, m: ServedModel, req: MessagesRequest | CountTokensRequest,
                  plan: ToolPlan) -> list[int]:
    return await chat_ids(state, m, req.template_messages(), True, **plan.template_kwargs())


@router.post("/v1/messages", responses=_OK)
async def messages(req: MessagesRequest, request: Request, state: State) -> Response:
    m = state.model_for(req.model)
    plan = _plan(req, m.tokenizer.chat_template)
    prompt = await _prompt(state, m, req, plan)
    fmt = req.output_config.format if req.output_config is not None else None
    spec = with_tools(G.schema_spec(fmt.schema_, "output_config.format") if fmt is not None else None, plan)
    kw: dict[str, Any] = {"temperature": 1.0 if req.temperature is None else req.temperature,
                          "max_tokens": req.max_tokens, "stop": req.stop_sequences, "guided": spec}
    kw |= {k: v for k, v in (("top_p", req.top_p), ("top_k", req.top_k)) if v is not None}
    params = sampling_params(lambda: SamplingParams(**kw))
    handles = await submit(m, [prompt], params, "messages")
    return await respond(request, state, m, handles, req.stream,
                         lambda src: S.stream_events(src, m.name, plan, len(prompt)),
                         lambda outs: S.body(m.name, Reply.of(outs[0], plan)), NAMED_SSE_ANTHROPIC)


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, state: State) -> dict[str, int]:
    m = state.model_for(req.model)
    return {"input_tokens": len(await _prompt(state, m, req, _plan(req, m.tokenizer.chat_template)))}
