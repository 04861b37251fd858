"""POST /v1/chat/completions: OpenAI chat (``n``, logprobs, tools and tool calls also streamed,
structured outputs, vLLM's ``continue_final_message``, chat ``echo`` and ``prompt_logprobs``): its request
schema (messages, content parts, tool calls), its serving logic and its body and stream chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from annotated_types import MaxLen, MinLen
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.api_error import APIError, error_responses
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
from hitenter.server.openai_serving import (
    NO_UNKNOWN,
    SYSTEM_FINGERPRINT,
    SamplingRequest,
    TokenBytes,
    UsageSoFar,
    chat_logprobs,
    finish_fields,
    prepare_params,
    requires_when,
    scores_for,
    usage,
    vllm_prompt_logprobs,
)
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.reply import (
    NO_TOOLS,
    Tool,
    ToolPlan,
    ToolTextStream,
    message_tool_fields,
    plan_tools,
    split_reply,
)
from hitenter.server.schema_types import (
    Bool,
    NLogprobs,
    NonNegInt,
    PositiveInt,
)
from hitenter.server.schema_types import Nested as _Nested
from hitenter.server.serving_completion import OK_OR_STREAM

Role = Literal["system", "user", "assistant", "tool"]


class ChatExtras(BaseModel):
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: Bool | None = None
    continue_final_message: Bool = False
    echo: Bool = False


class ContentPart(_Nested):
    type: Literal["text"]
    text: str


class FunctionCall(_Nested):
    name: str
    arguments: str | dict[str, Any]                    # OpenAI sends a JSON string; some clients an object


class ToolCall(_Nested):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall
    index: NonNegInt | None = None                     # present when a client joins streamed deltas


class ChatMessage(_Nested):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None           # assistant turns that called tools
    tool_call_id: str | None = None                    # tool results
    # OpenAI's own assistant-message fields, as a client sends back a message it received: only empty
    refusal: None = None
    function_call: None = None
    audio: None = None
    annotations: Annotated[list[Any], MaxLen(0)] | None = None

    def as_dict(self) -> dict[str, Any]:
        c = self.content
        if isinstance(c, list):
            bad = [p.type for p in c if p.type != "text" or p.text is None]
            if bad:
                raise APIError(400, f"messages: only text content parts are supported, got {bad[0]!r}",
                               "messages")
            c = "".join(p.text or "" for p in c)
        d: dict[str, Any] = {"role": self.role, "content": c or ""}
        if self.name:
            d["name"] = self.name
        if self.tool_calls or self.tool_call_id:
            calls = [tc.model_dump(exclude_none=True) for tc in self.tool_calls or []]
            d.update(message_tool_fields(calls or None, self.tool_call_id))
        return d


class ChatCompletionRequest(ChatExtras, SamplingRequest):
    model_config = ConfigDict(extra="allow", json_schema_extra={**NO_UNKNOWN, "allOf": [
        requires_when("top_logprobs", {"type": "integer"}, {"logprobs": {"const": True}}, present=True),
        requires_when("continue_final_message", {"const": True}, {"add_generation_prompt": {"const": False}},
                  present=True)]})
    messages: Annotated[list[ChatMessage], MinLen(1)]
    logprobs: Bool = False
    top_logprobs: NLogprobs | None = None
    max_completion_tokens: PositiveInt | None = None
    add_generation_prompt: Bool = True

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs: requires logprobs to be true", "top_logprobs")
        lp = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        try:
            return SamplingParams(**self.sampling_kwargs(), max_tokens=max_tokens, logprobs=lp)
        except ValueError as e:
            msg = str(e)
            if msg.startswith("logprobs:"):
                raise APIError(400, "top_logprobs" + msg[len("logprobs"):], "top_logprobs") from e
            if msg.startswith("max_tokens:") and self.max_completion_tokens is not None:
                raise APIError(400, "max_completion_tokens" + msg[len("max_tokens"):],
                               "max_completion_tokens") from e
            raise

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.as_dict() for m in self.messages]


router = APIRouter(responses=error_responses(400, 404, 413, 429))


@router.post("/v1/chat/completions", responses=OK_OR_STREAM)
async def chat_completions(req: ChatCompletionRequest, request: Request, state: State) -> Response:
    m = state.model_for(req.model)
    plan = chat_plan(req, m.tokenizer.chat_template)
    params = prepare_params(req, sampling_params(req.to_sampling_params), plan)
    prompt = await chat_ids(state, m, req.message_dicts(), req.add_generation_prompt,
                            continue_final=req.continue_final_message,
                            **({} if plan is NO_TOOLS else plan.template_kwargs()))
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
    """Tool calls parsed out of each choice, the echo, the prompt logprobs, the fingerprint."""
    body["system_fingerprint"] = SYSTEM_FINGERPRINT
    for ch in body["choices"]:
        content, calls = (ch["message"]["content"], []) if plan is NO_TOOLS else \
            split_reply(ch["message"]["content"] or "", plan)
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
            piece = ch.get("delta", {}).get("content", "")
            if plan is not NO_TOOLS:      # text that may become a call is held back
                piece = texts.setdefault(i, ToolTextStream(plan)).feed(piece)
            delta: dict[str, Any] = {}
            if ch.get("finish_reason") and plan is not NO_TOOLS:
                rest, calls = texts.setdefault(i, ToolTextStream(plan)).finish()
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
