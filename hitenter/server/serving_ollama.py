"""Ollama's generation API on the same port: POST /api/chat and /api/generate, streamed as NDJSON by
default (``"stream": false`` for one object), with Ollama's final statistics (ollama_shapes.py).

- chat: messages (system / user / assistant with ``tool_calls`` / tool results), ``tools`` (the
  model decides: Ollama has no tool_choice), ``format`` ``"json"`` or a JSON schema (structured
  outputs), ``options`` (ollama_protocol.Options), ``logprobs`` / ``top_logprobs``;
- generate: ``prompt`` through the chat template with ``system`` (``raw``: as it is), ``context`` (the
  ids an earlier reply returned, continued), ``suffix`` where the model has fill-in-the-middle tokens;
- an empty chat / prompt loads the model (``done_reason: "load"``) as Ollama does.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hitenter.engine.structured import GuidedSpec
from hitenter.sampling_params import SamplingParams
from hitenter.server import guided as G
from hitenter.server import ollama_shapes as S
from hitenter.server.api_error import APIError, SafeJSONResponse, overflow_error
from hitenter.server.errors import error_responses
from hitenter.server.framing import NDJSON
from hitenter.server.generation import respond, sampling_params, submit
from hitenter.server.ollama_protocol import ChatRequest, GenerateRequest, Options, base_name
from hitenter.server.reply import Reply
from hitenter.server.state import ServedModel, ServerState, State, chat_ids, check_ids, encode
from hitenter.server.tools import NO_TOOLS, ToolPlan, plan_tools, with_tools

router = APIRouter(responses=error_responses(400, 404, 413, 429))
_OK = {200: {"content": {"application/json": {}, "application/x-ndjson": {}},
             "description": "The reply, or (the default) its NDJSON stream"}}
_FIM = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"), ("<PRE>", "<SUF>", "<MID>"))


def model_of(state: ServerState, name: str) -> ServedModel:
    """The served model of an Ollama name (``tiny`` or ``tiny:latest``); 404 in Ollama's words."""
    if base_name(name) not in state.models:
        raise APIError(404, f"model '{name}' not found; served: {sorted(state.models)}", "model")
    return state.models[base_name(name)]


def fim_tokens(tok: Any) -> tuple[int, int, int] | None:
    """(prefix, suffix, middle) special token ids of a fill-in-the-middle vocabulary, or None."""
    for names in _FIM:
        ids = [tok.encode(n, add_bos=False) for n in names]
        if all(len(i) == 1 and tok.is_special(i[0]) for i in ids):
            return ids[0][0], ids[1][0], ids[2][0]
    return None


def _format_spec(fmt: str | dict[str, Any] | None) -> GuidedSpec | None:
    if fmt in (None, ""):
        return None
    return G.json_spec("format") if fmt == "json" else G.schema_spec(fmt, "format")


def _refuse_unsupported(req: ChatRequest | GenerateRequest) -> None:
    if req.think not in (None, False):
        raise APIError(400, "think: no served model has a thinking mode; omit it or send false", "think")
    if isinstance(req, GenerateRequest) and req.images:
        raise APIError(400, "images: no served model takes images", "images")
    if isinstance(req, GenerateRequest) and req.template:
        raise APIError(400, "template: a custom prompt template is not supported (the model's own renders)",
                       "template")


def _params(m: ServedModel, req: ChatRequest | GenerateRequest, prompt: list[int], spec: GuidedSpec | None,
            param: str) -> SamplingParams:
    """SamplingParams from ``options`` (Ollama's defaults), ``num_ctx`` narrowing the window."""
    opts = req.options or Options()
    try:
        kw = opts.sampling_kwargs()
    except ValueError as e:
        raise APIError(400, f"options.{e}", "options.num_predict") from e
    if opts.num_ctx is not None:
        if opts.num_ctx > m.max_model_len:
            raise APIError(400, f"options.num_ctx: {opts.num_ctx} is larger than this server's window of "
                           f"{m.max_model_len} tokens (start it with a larger --max-model-len)", "options.num_ctx")
        room = opts.num_ctx - len(prompt)
        if room < 1 or (kw["max_tokens"] or 0) > room:
            raise overflow_error(param, len(prompt), opts.num_ctx, kw["max_tokens"])
        kw["max_tokens"] = kw["max_tokens"] or room
    lp = (req.top_logprobs or 0) if req.logprobs else None
    return sampling_params(lambda: SamplingParams(**kw, logprobs=lp, guided=spec))


def chat_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """Ollama messages as the chat template takes them (tool calls with object arguments)."""
    out = []
    for i, msg in enumerate(req.messages):
        if msg.images:
            raise APIError(400, f"messages.{i}.images: no served model takes images", f"messages.{i}.images")
        d: dict[str, Any] = {"role": msg.role, "content": msg.content}
        if msg.tool_calls:
            d["tool_calls"] = [{"id": tc.id or f"call_{i}_{j}", "type": "function",
                                "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                               for j, tc in enumerate(msg.tool_calls)]
        if msg.role == "tool":
            if msg.tool_name:
                d["name"] = msg.tool_name
            if msg.tool_call_id:
                d["tool_call_id"] = msg.tool_call_id
        out.append(d)
    return out


def _loaded(model: str, key: str, keep_alive: Any) -> dict[str, Any]:
    """An empty request: Ollama loads (or, with keep_alive 0, unloads) the model and answers at once."""
    reason = "unload" if keep_alive in (0, "0", "0s", "0m") else "load"
    empty = {"role": "assistant", "content": ""} if key == "message" else ""
    return {"model": model, "created_at": S.created_at(), key: empty, "done": True, "done_reason": reason}


@router.post("/api/chat", responses=_OK)
async def chat(req: ChatRequest, request: Request, state: State) -> Response:
    t0 = time.monotonic()
    m = model_of(state, req.model)
    _refuse_unsupported(req)
    if not req.messages:
        return SafeJSONResponse(_loaded(req.model, "message", req.keep_alive))
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    plan = plan_tools(tools, None, None, m.tokenizer.chat_template) if tools else NO_TOOLS
    spec = with_tools(_format_spec(req.format), plan)
    prompt = await chat_ids(state, m, chat_messages(req), True, **plan.template_kwargs())
    params = _params(m, req, prompt, spec, "messages")
    handles = await submit(m, [prompt], params, "messages")
    tb = m.tokenizer.token_bytes if req.logprobs else None
    return await respond(request, state, m, handles, req.stream,
                         lambda src: S.chat_stream(src, req.model, plan, t0, tb),
                         lambda outs: S.chat_body(req.model, Reply.of(outs[0], plan), t0, tb), NDJSON)


async def generate_ids(state: ServerState, m: ServedModel, req: GenerateRequest) -> list[int]:
    """The prompt's ids: fill-in-the-middle with a suffix, as written when raw, else through the chat
    template (with ``system``); an earlier reply's ``context`` first."""
    if req.suffix:
        fim = fim_tokens(m.tokenizer)
        if fim is None:
            raise APIError(400, f"suffix: the model `{m.name}` has no fill-in-the-middle tokens", "suffix")
        pre, suf = await encode(m, req.prompt, "prompt", False), await encode(m, req.suffix, "suffix", False)
        ids = [fim[0], *pre, fim[1], *suf, fim[2]]
    elif req.raw or m.client.info.toy or not m.tokenizer.chat_template:
        ids = await encode(m, req.prompt, "prompt", None if not req.context else False)
    else:
        msgs = ([{"role": "system", "content": req.system}] if req.system else []) + [
            {"role": "user", "content": req.prompt}]
        ids = await chat_ids(state, m, msgs, True, param="prompt")
    ids = list(req.context or []) + ids
    check_ids(m, ids, "prompt")
    return ids


@router.post("/api/generate", responses=_OK)
async def generate(req: GenerateRequest, request: Request, state: State) -> Response:
    t0 = time.monotonic()
    m = model_of(state, req.model)
    _refuse_unsupported(req)
    check_ids(m, list(req.context or []), "context")
    if not req.prompt and not req.suffix:
        return SafeJSONResponse(_loaded(req.model, "response", req.keep_alive))
    prompt = await generate_ids(state, m, req)
    params = _params(m, req, prompt, _format_spec(req.format), "prompt")
    handles = await submit(m, [prompt], params, "prompt")
    tb = m.tokenizer.token_bytes if req.logprobs else None
    plan: ToolPlan = NO_TOOLS
    return await respond(request, state, m, handles, req.stream,
                         lambda src: S.generate_stream(src, req.model, plan, t0, tb),
                         lambda outs: S.generate_body(req.model, Reply.of(outs[0], plan), t0, tb), NDJSON)
