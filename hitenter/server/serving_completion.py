"""POST /v1/completions: OpenAI's legacy completions (several prompts, ``n``, ``echo``,
logprobs, prompt scoring with ``max_tokens: 0`` as lm-eval's loglikelihood requests send it): its request
schema, its serving logic and its body and stream chunks (the legacy logprobs form).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from annotated_types import Interval, MaxLen, MinLen
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ConfigDict

from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.api_error import APIError, SafeJSONResponse, error_responses
from hitenter.server.generation import (
    ServedModel,
    Source,
    State,
    encode,
    new_id,
    now,
    respond,
    sampling_params,
    submit,
)
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.protocol_openai import NO_UNKNOWN, SamplingRequest, requires_when
from hitenter.server.schema_types import (
    STRICT,
    Bool,
    NLogprobs,
    NonEmpty,
    NonNegInt,
    TokenId,
)
from hitenter.server.serving_chat import (
    OK_OR_STREAM,
    SYSTEM_FINGERPRINT,
    Decode,
    UsageSoFar,
    finish_fields,
    finite_logprob,
    prepare_params,
    scores_for,
    usage,
    vllm_prompt_logprobs,
)


class CompletionRequest(SamplingRequest):
    # max_tokens 0 scores the prompt only (echo: lm-eval's loglikelihood requests); else >= 1
    model_config = ConfigDict(extra="allow", json_schema_extra={**NO_UNKNOWN, "allOf": [
        requires_when("max_tokens", {"const": 0}, {"echo": {"const": True}}, present=True),
        requires_when("best_of", {"const": 1}, {"n": {"const": 1}})]})
    prompt: NonEmpty | Annotated[list[NonEmpty], MinLen(1)] | Annotated[list[TokenId], MinLen(1)] \
        | Annotated[list[Annotated[list[TokenId], MinLen(1)]], MinLen(1)]
    logprobs: NLogprobs | None = None
    echo: Bool = False
    suffix: Annotated[str, MaxLen(0)] | None = None
    # best_of: only 1, with n = 1 (no best-of selection; JSON Schema can state this, unlike best_of == n)
    best_of: Annotated[int, Interval(ge=1, le=1), STRICT] | None = None
    max_tokens: NonNegInt | None = None

    @property
    def echoes_logprobs(self) -> bool:
        return self.echo and self.logprobs is not None

    def to_sampling_params(self) -> SamplingParams:
        if self.max_tokens == 0 and not self.echo:
            raise APIError(400, "max_tokens: 0 is only allowed with echo (scoring the prompt)", "max_tokens")
        if self.suffix:
            raise APIError(400, "suffix: is not supported", "suffix")
        if self.best_of is not None and self.n != 1:
            raise APIError(400, "best_of: only 1 is supported, with n = 1 (omit it to get n completions)", "best_of")
        max_tokens = 16 if self.max_tokens is None else self.max_tokens   # OpenAI's legacy default
        if max_tokens == 0 and self.echo:    # scoring only (lm-eval): the prompt's logprobs, no generation
            max_tokens = 1
        return SamplingParams(**self.sampling_kwargs(), max_tokens=max_tokens, logprobs=self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt: must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


router = APIRouter(responses=error_responses(400, 404, 413, 429))


@router.post("/v1/completions", responses=OK_OR_STREAM)
async def completions(req: CompletionRequest, request: Request, state: State) -> Response:
    m = await state.model_for(req.model)
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


def completion_logprobs(positions: list[PositionLogprobs], offset: int) -> dict[str, Any]:
    """Legacy completions shape; ``offset`` is the text length before the first of these tokens."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for pos in positions:
        tokens.append(pos.chosen.token)
        token_lps.append(finite_logprob(pos.chosen.logprob))
        top = {t.token: finite_logprob(t.logprob) for t in pos.top}
        top.setdefault(pos.chosen.token, finite_logprob(pos.chosen.logprob))
        tops.append(top)
        offsets.append(offset)
        offset += len(pos.chosen.token)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def _tok_len(positions: list[PositionLogprobs] | None) -> int:
    return sum(len(p.chosen.token) for p in positions or [])


def build_completion(outs: list[RequestOutput], model: str, n: int, echo: list[str]) -> dict[str, Any]:
    choices = []
    for i, out in enumerate(outs):
        for c in out.outputs:
            lps = None if c.logprobs is None else completion_logprobs(c.logprobs, len(echo[i]))
            choices.append({"index": i * n + c.index, "text": echo[i] + c.text, "logprobs": lps,
                            **finish_fields(c.finish_reason, c.stop_reason)})
    return {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(outs)}


async def stream_completion(src: Source, model: str, n: int, echo: list[str], include_usage: bool,
                            continuous: bool = False) -> AsyncIterator[dict[str, Any]]:
    """Completion chunks; ``continuous``: each carries the usage so far (vLLM's continuous_usage_stats)."""
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model}
    tok_offset: dict[int, int] = {}
    done: set[int] = set()
    finals: dict[int, RequestOutput] = {}
    so_far = UsageSoFar()
    async for i, out in src:
        so_far.add(i, out)
        if out.finished:
            finals[i] = out
        for c in out.outputs:
            idx = i * n + c.index
            if idx in done:
                continue
            text = c.delta_text
            if idx not in tok_offset:
                tok_offset[idx] = len(echo[i])
                text = echo[i] + text
            lps = None
            if c.delta_logprobs:
                lps = completion_logprobs(c.delta_logprobs, tok_offset[idx])
                tok_offset[idx] += _tok_len(c.delta_logprobs)
            if not (text or lps or c.finish_reason):
                continue
            if c.finish_reason:
                done.add(idx)
            chunk = {**head, "choices": [{"index": idx, "text": text, "logprobs": lps,
                                          **finish_fields(c.finish_reason, c.stop_reason)}]}
            yield {**chunk, "usage": so_far.usage()} if continuous else chunk
    if include_usage:
        yield {**head, "choices": [], "usage": usage([finals[i] for i in sorted(finals)])}


def legacy_prompt_logprobs(sc: PromptScores, decode: Decode) -> dict[str, Any]:
    """The completions ``logprobs`` object of an echoed prompt: leading null, tokens, text_offset."""
    tokens, lps, tops, offsets, offset = [], [], [], [], 0
    for tid, lp in zip(sc.token_ids, sc.logprobs, strict=True):
        piece = decode([tid])
        tokens.append(piece)
        offsets.append(offset)
        offset += len(piece)
        if lp is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(finite_logprob(lp.logprob))
        top = {decode([t]): finite_logprob(v) for t, v, _ in lp.top}
        top.setdefault(piece, finite_logprob(lp.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
