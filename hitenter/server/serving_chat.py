"""POST /v1/chat/completions: OpenAI chat (``n``, logprobs, tools and tool calls also streamed,
structured outputs, vLLM's ``continue_final_message``, chat ``echo`` and ``prompt_logprobs``): its serving
logic and its body and stream chunks (the request bodies: protocol_openai.py).

It also holds what /v1/completions (serving_completion.py) builds on (vLLM's OpenAIServing): the field
checks and structured output on the SamplingParams (``prepare_params``), the prompt scores a request wants
(legacy ``echo`` + ``logprobs``, ``max_tokens=0``, vLLM's ``prompt_logprobs``: ``scores_for``), and the
response pieces both build (usage, finish fields, logprobs). JSON has no -inf: a logprob of -inf is sent
as -9999.0 (vLLM clamps the same way).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.api_error import APIError, check_known_fields, error_responses
from hitenter.server.chat_format import ReplyParser, Thought, chat_format_of
from hitenter.server.generation import (
    ServedModel,
    Source,
    State,
    chat_ids,
    new_id,
    now,
    respond,
    sampling_params,
    submit,
)
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.protocol_openai import ChatCompletionRequest
from hitenter.server.reply import (
    NO_TOOLS,
    ToolPlan,
    bind,
    plan_tools,
    reply_params,
    thinking_budget,
)
from hitenter.server.tool_parsers import ToolDelta

# --- what /v1/completions shares (vLLM's OpenAIServing): the checks, the response pieces ---

OK_OR_STREAM = {200: {"content": {"application/json": {}, "text/event-stream": {}},
                      "description": "The completion, or with `stream` its server-sent events"}}


def prepare_params(req: Any, params: SamplingParams, plan: ToolPlan | None = None) -> SamplingParams:
    """400 for unknown fields; the request's structured output (or its tool plan's) on the params."""
    check_known_fields(req)
    spec = req.structured_spec()
    if plan is not None and plan.structured is not None:
        if spec is not None:
            raise APIError(400, f"{spec.param}: cannot be combined with tool_choice {plan.mode!r}", spec.param)
        spec = plan.structured
    if req.stream and req.prompt_logprobs is not None:
        raise APIError(400, "prompt_logprobs: not supported when streaming", "prompt_logprobs")
    if req.stream and req.echoes_logprobs:
        raise APIError(400, "echo: echo with logprobs is not supported when streaming", "echo")
    return params if spec is None else params.replace(structured=spec)


async def scores_for(m: ServedModel, req: Any, prompts: list[list[int]]) -> list[PromptScores] | None:
    """Prompt logprobs when the request wants them (legacy echo+logprobs, or prompt_logprobs)."""
    k = req.prompt_logprobs
    legacy = req.echoes_logprobs
    if k is None and not legacy:
        return None
    if legacy:
        k = max(k or 0, req.logprobs)
    if any(getattr(p, "runs", None) for p in prompts):   # an ImagePrompt: scoring runs on token ids alone
        raise APIError(400, "prompt_logprobs: not available for a prompt holding images", "prompt_logprobs")
    try:
        return await m.client.score(prompts, k or 0)      # engine work, between its steps
    except ValueError as e:
        raise APIError(400, str(e), "prompt") from e


_LOGPROB_FLOOR = -9999.0


TokenBytes = Callable[[int], bytes]


Decode = Callable[[list[int]], str]


SYSTEM_FINGERPRINT = None     # OpenAI's field, present (null: no fixed backend configuration id)


def finite_logprob(x: float) -> float:
    return x if math.isfinite(x) else _LOGPROB_FLOOR


def chat_logprobs(positions: list[PositionLogprobs], token_bytes: Any, k: int) -> dict[str, Any]:
    def entry(token_id: int, token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": finite_logprob(logprob), "bytes": list(token_bytes(token_id))}

    content = []
    for pos in positions:
        e = entry(pos.chosen.token_id, pos.chosen.token, pos.chosen.logprob)
        e["top_logprobs"] = [entry(t.token_id, t.token, t.logprob) for t in pos.top[:k]]
        content.append(e)
    return {"content": content}


def usage(outs: list[RequestOutput]) -> dict[str, Any]:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class UsageSoFar:
    """Token counts as a stream goes (``stream_options.continuous_usage_stats``): every output seen."""

    def __init__(self, prompt_tokens: dict[int, int] | None = None) -> None:
        self.prompt: dict[int, int] = dict(prompt_tokens or {})
        self.completion = 0

    def add(self, i: int, out: RequestOutput) -> None:
        self.prompt.setdefault(i, len(out.prompt_token_ids))
        self.completion += sum(len(c.delta_token_ids) for c in out.outputs)

    def usage(self) -> dict[str, int]:
        p = sum(self.prompt.values())
        return {"prompt_tokens": p, "completion_tokens": self.completion, "total_tokens": p + self.completion}


def finish_fields(finish_reason: str | None, stop_reason: int | str | None) -> dict[str, Any]:
    fr = finish_reason if finish_reason in (None, "stop", "length") else "stop"
    return {"finish_reason": fr, "stop_reason": stop_reason if fr is not None else None}


def vllm_prompt_logprobs(sc: PromptScores, decode: Decode) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: per position null (first) or {token_id: {logprob, rank, decoded_token}}."""
    out: list[dict[str, Any] | None] = []
    for tid, lp in zip(sc.token_ids, sc.logprobs, strict=True):
        if lp is None:
            out.append(None)
            continue
        d = {str(t): {"logprob": finite_logprob(v), "rank": r, "decoded_token": decode([t])} for t, v, r in lp.top}
        d[str(tid)] = {"logprob": finite_logprob(lp.logprob), "rank": lp.rank, "decoded_token": decode([tid])}
        out.append(d)
    return out


# --- /v1/chat/completions ------------------------------------------------------------------------------

router = APIRouter(responses=error_responses(400, 404, 413, 429))


@router.post("/v1/chat/completions", responses=OK_OR_STREAM)
async def chat_completions(req: ChatCompletionRequest, request: Request, state: State) -> Response:
    m = await state.model_for(req.model)
    plan = chat_plan(req, m.tokenizer.chat_template)
    fmt = chat_format_of(m.tokenizer)
    params = prepare_params(req, sampling_params(req.to_sampling_params), plan)
    think_vars = req.thinking_kwargs(fmt.template_kwargs)
    prompt = await chat_ids(state, m, fmt.with_reasoning(req.message_dicts()), req.add_generation_prompt,
                            continue_final=req.continue_final_message,
                            **{**think_vars, **({} if plan is NO_TOOLS else plan.template_kwargs())})
    plan = bind(plan, m.tokenizer, prompt, fmt.thinking_on(think_vars),
                thinking_budget(state.reasoning_budget, req.thinking_token_budget))
    params = reply_params(params, plan)
    scores = await scores_for(m, req, [prompt])
    handles = await submit(m, [prompt], params, "messages")
    k, tb, echo = req.top_logprobs or 0, m.tokenizer.token_bytes, echo_prefix(req)

    def stream(src: Source) -> AsyncIterator[dict[str, Any]]:
        chunks = stream_chat(src, m.name, params.n, k, tb, req.include_usage, req.continuous_usage, len(prompt))
        return decorate_stream(chunks, plan, echo)

    return await respond(request, state, m, handles, req.stream, stream,
                         lambda outs: decorate(build_chat(outs, m.name, k, tb), m, plan, echo, scores))


def chat_plan(req: ChatCompletionRequest, chat_template: str | None) -> ToolPlan:
    if req.continue_final_message and req.add_generation_prompt:
        raise APIError(400, "continue_final_message: set add_generation_prompt to false with it",
                       "continue_final_message")
    if not req.tools and req.tool_choice in (None, "none"):
        return NO_TOOLS           # nothing to render or parse
    tools = [t.model_dump(exclude_none=True) for t in (req.tools or [])]
    return plan_tools(tools, req.tool_choice, req.parallel_tool_calls, chat_template)


def echo_prefix(req: ChatCompletionRequest) -> str:
    """vLLM's chat ``echo``: the reply starts with the last message when it is the assistant's."""
    last = req.messages[-1]
    return str(last.as_dict()["content"]) if req.echo and last.role == "assistant" else ""


def decorate(body: dict[str, Any], m: ServedModel, plan: ToolPlan, echo: str,
             scores: list[PromptScores] | None) -> dict[str, Any]:
    """Each choice split into reasoning (``reasoning_content``), content and tool calls; the echo, the
    prompt logprobs, the fingerprint."""
    body["system_fingerprint"] = SYSTEM_FINGERPRINT
    for ch in body["choices"]:
        reasoning, content, calls = plan.reply_parser().split(ch["message"]["content"] or "")
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if calls:
            msg.update(content=content.strip() or None, tool_calls=calls)
            ch["finish_reason"] = "tool_calls"
        if echo:
            msg["content"] = echo + (msg["content"] or "")
        ch["message"] = msg
    if scores is not None:
        body["prompt_logprobs"] = vllm_prompt_logprobs(scores[0], m.tokenizer.decode)
    return body


def _delta_of(outs: list[Any]) -> dict[str, Any]:
    """One chunk's delta from a reply parser's outputs (reasoning, content, tool-call pieces)."""
    delta: dict[str, Any] = {}
    for o in outs:
        if isinstance(o, Thought):
            delta["reasoning_content"] = delta.get("reasoning_content", "") + o.text
        elif isinstance(o, ToolDelta):
            calls = delta.setdefault("tool_calls", [])
            if o.name is not None:
                calls.append({"index": o.index, "id": o.id, "type": "function",
                              "function": {"name": o.name, "arguments": o.arguments}})
            elif calls and calls[-1]["index"] == o.index:
                calls[-1]["function"]["arguments"] += o.arguments
            else:
                calls.append({"index": o.index, "function": {"arguments": o.arguments}})
        elif o:
            delta["content"] = delta.get("content", "") + o
    return delta


async def decorate_stream(chunks: AsyncIterator[dict[str, Any]], plan: ToolPlan,
                          echo: str = "") -> AsyncIterator[dict[str, Any]]:
    """Each choice's deltas through its reply parser: ``reasoning_content`` for the thinking section,
    ``content`` held back while it may become markup, ``tool_calls`` (a call's id and name, then its
    arguments as they come) and finish_reason ``tool_calls``. The echo goes before a choice's first
    content."""
    parsers: dict[int, ReplyParser] = {}
    echoed: set[int] = set()
    try:
        async for chunk in chunks:
            chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
            if not chunk.get("choices") or "role" in chunk["choices"][0].get("delta", {}):
                yield chunk
                continue
            ch = chunk["choices"][0]
            i = ch["index"]
            rp = parsers.setdefault(i, plan.reply_parser())
            outs = rp.feed(ch.get("delta", {}).get("content", ""))
            if ch.get("finish_reason"):
                outs += rp.finish()
                if rp.calls:
                    ch = {**ch, "finish_reason": "tool_calls"}
            delta = _delta_of(outs)
            if echo and i not in echoed:
                echoed.add(i)
                delta["content"] = echo + delta.get("content", "")
            if delta or ch.get("finish_reason") or ch.get("logprobs"):
                yield {**chunk, "choices": [{**ch, "delta": delta}]}
    finally:
        await chunks.aclose()     # type: ignore[attr-defined]


def build_chat(outs: list[RequestOutput], model: str, k: int, token_bytes: TokenBytes) -> dict[str, Any]:
    choices = []
    for c in outs[0].outputs:
        lps = None if c.logprobs is None else chat_logprobs(c.logprobs, token_bytes, k)
        choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": lps,
                        **finish_fields(c.finish_reason, c.stop_reason)})
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(outs)}


async def stream_chat(src: Source, model: str, n: int, k: int, token_bytes: TokenBytes, include_usage: bool,
                      continuous: bool = False, prompt_tokens: int = 0) -> AsyncIterator[dict[str, Any]]:
    """Chat chunks: a role chunk per choice, content deltas, finish; ``continuous`` as in stream_completion
    (``prompt_tokens``: the prompt's length, for the role chunks' usage)."""
    head = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": now(), "model": model}
    so_far = UsageSoFar({0: prompt_tokens})
    extra: Callable[[], dict[str, Any]] = (lambda: {"usage": so_far.usage()}) if continuous else dict
    for idx in range(n):
        yield {**head, "choices": [{"index": idx, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}], **extra()}
    done: set[int] = set()
    final: list[RequestOutput] = []
    async for _, out in src:
        so_far.add(0, out)
        if out.finished:
            final = [out]
        for c in out.outputs:
            if c.index in done:
                continue
            lps = chat_logprobs(c.delta_logprobs, token_bytes, k) if c.delta_logprobs else None
            if not (c.delta_text or lps or c.finish_reason):
                continue
            if c.finish_reason:
                done.add(c.index)
            delta = {"content": c.delta_text} if c.delta_text else {}
            yield {**head, "choices": [{"index": c.index, "delta": delta, "logprobs": lps,
                                        **finish_fields(c.finish_reason, c.stop_reason)}], **extra()}
    if include_usage:
        yield {**head, "choices": [], "usage": usage(final)}
