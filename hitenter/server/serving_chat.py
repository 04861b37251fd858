"""POST /v1/chat/completions: OpenAI chat (``n``, logprobs, tools and tool calls also streamed,
structured outputs, vLLM's ``continue_final_message``, chat ``echo`` and ``prompt_logprobs``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.server.api_error import APIError
from hitenter.server.errors import error_responses
from hitenter.server.generation import respond, sampling_params, submit
from hitenter.server.openai_params import prepare_params, scores_for
from hitenter.server.openai_shapes import SYSTEM_FINGERPRINT, build_chat, stream_chat, vllm_prompt_logprobs
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.protocol import ChatCompletionRequest
from hitenter.server.serving_completion import OK_OR_STREAM
from hitenter.server.state import ServedModel, State, chat_ids
from hitenter.server.streams import Source
from hitenter.server.tools import ToolPlan, ToolTextStream, plan_tools, split_reply

router = APIRouter(responses=error_responses(400, 404, 413, 429))


@router.post("/v1/chat/completions", responses=OK_OR_STREAM)
async def chat_completions(req: ChatCompletionRequest, request: Request, state: State) -> Response:
    m = state.model_for(req.model)
    plan = chat_plan(req, m.tokenizer.chat_template)
    params = prepare_params(req, sampling_params(req.to_sampling_params), plan)
    prompt = await chat_ids(state, m, req.message_dicts(), req.add_generation_prompt,
                            continue_final=req.continue_final_message, **plan.template_kwargs())
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
    tools = [t.model_dump(exclude_none=True) for t in (req.tools or [])]
    return plan_tools(tools, req.tool_choice, req.parallel_tool_calls, chat_template)


def echo_prefix(req: ChatCompletionRequest) -> str:
    """vLLM's chat ``echo``: the reply starts with the last message when it is the assistant's."""
    last = req.messages[-1]
    return str(last.as_dict()["content"]) if req.echo and last.role == "assistant" else ""


def decorate(body: dict[str, Any], m: ServedModel, plan: ToolPlan, echo: str,
             scores: list[PromptScores] | None) -> dict[str, Any]:
    """Tool calls parsed out of each choice, the echo, the prompt logprobs, the fingerprint."""
    body["system_fingerprint"] = SYSTEM_FINGERPRINT
    for ch in body["choices"]:
        content, calls = split_reply(ch["message"]["content"] or "", plan)
        if calls:
            ch["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
            ch["finish_reason"] = "tool_calls"
        if echo:
            ch["message"]["content"] = echo + (ch["message"]["content"] or "")
    if scores is not None:
        body["prompt_logprobs"] = vllm_prompt_logprobs(scores[0], m.tokenizer.decode)
    return body


async def decorate_stream(chunks: AsyncIterator[dict[str, Any]], plan: ToolPlan,
                          echo: str = "") -> AsyncIterator[dict[str, Any]]:
    """Content deltas held back while they may become a ``<tool_call>``; at the finish the calls follow
    as ``tool_calls`` deltas (one per call, with its whole arguments) and finish_reason ``tool_calls``.
    The echo goes before a choice's first content."""
    texts: dict[int, ToolTextStream] = {}
    echoed: set[int] = set()
    try:
        async for chunk in chunks:
            chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
            if not chunk.get("choices") or "role" in chunk["choices"][0].get("delta", {}):
                yield chunk
                continue
            ch = chunk["choices"][0]
            i = ch["index"]
            ts = texts.setdefault(i, ToolTextStream(plan))
            piece = ts.feed(ch.get("delta", {}).get("content", ""))
            delta: dict[str, Any] = {}
            if ch.get("finish_reason"):
                rest, calls = ts.finish()
                piece += rest
                if calls:
                    delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(calls)]
                    ch = {**ch, "finish_reason": "tool_calls"}
            if echo and i not in echoed:
                echoed.add(i)
                piece = echo + piece
            if piece:
                delta = {"content": piece, **delta}
            if delta or ch.get("finish_reason") or ch.get("logprobs"):
                yield {**chunk, "choices": [{**ch, "delta": delta}]}
    finally:
        await chunks.aclose()     # type: ignore[attr-defined]
