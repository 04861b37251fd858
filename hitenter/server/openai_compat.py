"""The completions/chat routes' hooks for issue 17's fields (kept out of api.py, which calls them):
field checks and structured outputs on the SamplingParams, tool plans, ``continue_final_message``,
chat ``echo``, prompt logprobs (``echo`` + ``logprobs``, ``max_tokens=0``, ``prompt_logprobs``) and
``system_fingerprint`` on every body and chunk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from hitenter.sampling_params import SamplingParams
from hitenter.server import protocol as P
from hitenter.server.prompt_logprobs import (
    PromptScores,
    legacy_prompt_logprobs,
    score_prompts,
    vllm_prompt_logprobs,
)
from hitenter.server.request_extras import check_known_fields
from hitenter.server.tools import ToolPlan, plan_tools, rewrite_chat_body, stream_tool_calls

SYSTEM_FINGERPRINT = None     # OpenAI's field, present (null: no fixed backend configuration id)


def prepare_params(req: Any, params: SamplingParams, plan: ToolPlan | None = None) -> SamplingParams:
    """400 for unknown fields; the request's structured output (or its tool plan's) on the params."""
    check_known_fields(req)
    spec = req.guided_spec()
    if plan is not None and plan.guided is not None:
        if spec is not None:
            raise P.APIError(400, f"{spec.param}: cannot be combined with tool_choice {plan.mode!r}", spec.param)
        spec = plan.guided
    if req.stream and req.prompt_logprobs is not None:
        raise P.APIError(400, "prompt_logprobs: not supported when streaming", "prompt_logprobs")
    if isinstance(req, P.CompletionRequest) and req.stream and req.echo and req.logprobs is not None:
        raise P.APIError(400, "echo: echo with logprobs is not supported when streaming", "echo")
    return params if spec is None else params.replace(guided=spec)


def chat_plan(req: Any, tokenizer: Any) -> ToolPlan:
    if req.continue_final_message and req.add_generation_prompt:
        raise P.APIError(400, "continue_final_message: set add_generation_prompt to false with it",
                         "continue_final_message")
    # any final role may be continued (as in transformers' and vLLM's continue_final_message)
    return plan_tools(req, tokenizer.chat_template)


def continue_final(rendered: str, messages: list[dict[str, Any]]) -> str:
    """The rendered conversation cut right after the final message's content (prefill)."""
    final = messages[-1].get("content") or ""
    if not final.strip():
        return rendered
    at = rendered.rfind(final.strip())
    if at < 0:
        raise P.APIError(400, "continue_final_message: the chat template changed the final message's text",
                         "continue_final_message")
    return rendered[:at + len(final.strip())]


def chat_echo_prefix(req: Any) -> str:
    """vLLM's chat ``echo``: the reply starts with the last message when it is the assistant's."""
    last = req.messages[-1]
    return str(last.as_dict()["content"]) if req.echo and last.role == "assistant" else ""


async def scores_for(m: Any, req: Any, prompts: list[list[int]]) -> list[PromptScores] | None:
    """Prompt logprobs when the request wants them (legacy echo+logprobs, or prompt_logprobs)."""
    k = req.prompt_logprobs
    legacy = isinstance(req, P.CompletionRequest) and req.echo and req.logprobs is not None
    if k is None and not legacy:
        return None
    if legacy:
        k = max(k or 0, req.logprobs)
    try:
        return await asyncio.to_thread(score_prompts, m.engine.engine, prompts, k or 0)   # a private KV cache
    except ValueError as e:
        raise P.APIError(400, str(e), "prompt") from e


def scoring_only(m: Any, req: Any, echo: list[str], scores: list[PromptScores] | None,
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
    return {"id": P.new_id("cmpl"), "object": "text_completion", "created": P.now(), "model": m.name,
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices,
            "usage": {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}}


def decorate_completion(body: dict[str, Any], m: Any, req: Any, scores: list[PromptScores] | None) -> dict[str, Any]:
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


def decorate_chat(body: dict[str, Any], m: Any, req: Any, plan: ToolPlan, echo: str,
                  scores: list[PromptScores] | None) -> dict[str, Any]:
    body["system_fingerprint"] = SYSTEM_FINGERPRINT
    if plan.parses:
        rewrite_chat_body(body, plan)
    if echo:
        for ch in body["choices"]:
            ch["message"]["content"] = echo + (ch["message"]["content"] or "")
    if scores is not None:
        body["prompt_logprobs"] = vllm_prompt_logprobs(scores[0], m.tokenizer.decode)
    return body


async def decorate_stream(chunks: AsyncIterator[dict[str, Any]], plan: ToolPlan | None = None,
                          echo: str = "") -> AsyncIterator[dict[str, Any]]:
    src = stream_tool_calls(chunks, plan) if plan is not None and plan.parses else chunks
    echoed: set[int] = set()
    try:
        async for c in src:
            c["system_fingerprint"] = SYSTEM_FINGERPRINT
            for ch in c.get("choices", []):
                d = ch.get("delta")
                if echo and d is not None and "role" not in d and ch["index"] not in echoed:
                    echoed.add(ch["index"])
                    d["content"] = echo + d.get("content", "")
            yield c
    finally:
        await src.aclose()     # type: ignore[attr-defined]
