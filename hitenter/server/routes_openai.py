"""The OpenAI routes: /v1/completions, /v1/chat/completions, /v1/models. One small function each;
the shared work is in ``serving`` (engine calls) and ``state`` (models, prompt checks)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.server import openai_compat as X
from hitenter.server import protocol as P
from hitenter.server.errors import error_responses
from hitenter.server.serving import params_of, respond, submit
from hitenter.server.sse import build_chat, build_completion, stream_chat, stream_completion
from hitenter.server.state import State, chat_ids, encode, model_card

router = APIRouter(responses=error_responses(400, 404, 413, 429))
_OK = {200: {"content": {"application/json": {}, "text/event-stream": {}},
             "description": "The completion, or with `stream` its server-sent events"}}


@router.post("/v1/completions", responses=_OK)
async def completions(req: P.CompletionRequest, request: Request,
                      state: State) -> Response:
    m = state.model_for(req.model)
    raw = req.prompts()
    params = X.prepare_params(req, params_of(req, len(raw)))    # 400 unknown fields; structured outputs
    prompts = [await encode(m, p, "prompt") for p in raw]
    echo = [(p if isinstance(p, str) else m.tokenizer.decode(p)) if req.echo else "" for p in raw]
    scores = await X.scores_for(m, req, prompts)          # prompt logprobs (echo + logprobs, prompt_logprobs)
    if req.echo and req.max_tokens == 0:                   # scoring only (lm-eval): nothing generated
        return P.SafeJSONResponse(X.scoring_only(m, req, echo, scores, prompts))
    handles = await submit(m, prompts, params, "prompt")
    return await respond(request, state, m, handles, req.stream,
                         lambda s: X.decorate_stream(stream_completion(s, m.name, params.n, echo,
                                                                       req.include_usage, req.continuous_usage)),
                         lambda outs: X.decorate_completion(build_completion(outs, m.name, params.n, echo),
                                                            m, req, scores))


@router.post("/v1/chat/completions", responses=_OK)
async def chat_completions(req: P.ChatCompletionRequest, request: Request,
                           state: State) -> Response:
    m = state.model_for(req.model)
    plan = X.chat_plan(req, m.tokenizer)                   # tools / tool_choice (hitenter/server/tools.py)
    params = X.prepare_params(req, params_of(req, 1), plan)
    prompt = await chat_ids(state, m, req.message_dicts(), req.add_generation_prompt,
                            continue_final=req.continue_final_message, **plan.template_kwargs())
    scores = await X.scores_for(m, req, [prompt])
    handles = await submit(m, [prompt], params, "messages")
    k, tb, echo = req.top_logprobs or 0, m.tokenizer.token_bytes, X.chat_echo_prefix(req)
    return await respond(request, state, m, handles, req.stream,
                         lambda s: X.decorate_stream(stream_chat(s, m.name, params.n, k, tb, req.include_usage,
                                                                 req.continuous_usage, len(prompt)),
                                                     plan, echo),
                         lambda outs: X.decorate_chat(build_chat(outs, m.name, k, tb), m, req, plan, echo, scores))


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, Any]:
    data = [model_card(m) for m in state.models.values()]
    return {"object": "list", "data": data}
