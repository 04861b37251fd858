"""POST /v1/completions: OpenAI's legacy completions (several prompts, ``n``, ``echo``, logprobs,
prompt scoring with ``max_tokens: 0`` as lm-eval's loglikelihood requests send it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.server.api_error import SafeJSONResponse
from hitenter.server.errors import error_responses
from hitenter.server.generation import respond, sampling_params, submit
from hitenter.server.openai_params import prepare_params, scores_for
from hitenter.server.openai_shapes import (
    SYSTEM_FINGERPRINT,
    build_completion,
    legacy_prompt_logprobs,
    stream_completion,
    vllm_prompt_logprobs,
)
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.protocol import CompletionRequest
from hitenter.server.schema_types import new_id, now
from hitenter.server.state import ServedModel, State, encode
from hitenter.server.streams import Source

router = APIRouter(responses=error_responses(400, 404, 413, 429))
OK_OR_STREAM = {200: {"content": {"application/json": {}, "text/event-stream": {}},
                      "description": "The completion, or with `stream` its server-sent events"}}


@router.post("/v1/completions", responses=OK_OR_STREAM)
async def completions(req: CompletionRequest, request: Request, state: State) -> Response:
    m = state.model_for(req.model)
    raw = req.prompts()
    params = prepare_params(req, sampling_params(req.to_sampling_params, len(raw)))
    prompts = [await encode(m, p, "prompt") for p in raw]
    echo = [(p if isinstance(p, str) else m.tokenizer.decode(p)) if req.echo else "" for p in raw]
    scores = await scores_for(m, req, prompts)
    if req.echo and req.max_tokens == 0:                   # scoring only (lm-eval): nothing generated
        return SafeJSONResponse(scoring_only(m, req, echo, scores, prompts))
    handles = await submit(m, prompts, params, "prompt")

    async def stream(src: Source) -> Any:
        async for c in stream_completion(src, m.name, params.n, echo, req.include_usage, req.continuous_usage):
            yield {**c, "system_fingerprint": SYSTEM_FINGERPRINT}

    return await respond(request, state, m, handles, req.stream, stream,
                         lambda outs: decorate(build_completion(outs, m.name, params.n, echo), m, req, scores))


def scoring_only(m: ServedModel, req: CompletionRequest, echo: list[str], scores: list[PromptScores] | None,
                 prompts: list[list[int]]) -> dict[str, Any]:
    """``max_tokens=0`` with ``echo``: the prompts back (with their logprobs), nothing generated."""
    dec = m.tokenizer.decode
    choices = []
    for i, text in enumerate(echo):
        for j in range(req.n):
            ch: dict[str, Any] = {"index": i * req.n + j, "text": text, "finish_reason": "length",
                                  "stop_reason": None, "logprobs": None}
            if scores is not None and req.logprobs is not None:
                ch["logprobs"] = legacy_prompt_logprobs(scores[i], dec)
            if scores is not None and req.prompt_logprobs is not None:
                ch["prompt_logprobs"] = vllm_prompt_logprobs(scores[i], dec)
            choices.append(ch)
    n = sum(map(len, prompts)) * req.n
    return {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": m.name,
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices,
            "usage": {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}}


def decorate(body: dict[str, Any], m: ServedModel, req: CompletionRequest,
             scores: list[PromptScores] | None) -> dict[str, Any]:
    """The prompt logprobs (echoed or vLLM's) joined to a finished completion body."""
    body["system_fingerprint"] = SYSTEM_FINGERPRINT
    if scores is None:
        return body
    dec = m.tokenizer.decode
    for ch in body["choices"]:
        sc = scores[ch["index"] // req.n]
        if req.prompt_logprobs is not None:
            ch["prompt_logprobs"] = vllm_prompt_logprobs(sc, dec)
        if req.echo and req.logprobs is not None:
            head, tail = legacy_prompt_logprobs(sc, dec), ch["logprobs"] or {}
            ch["logprobs"] = {key: head[key] + list(tail.get(key, [])) for key in head}
    return body
