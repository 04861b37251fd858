"""/tokenize and /detokenize (vLLM's extra routes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from hitenter.server import protocol as P
from hitenter.server.errors import error_responses
from hitenter.server.state import State, chat_ids, encode

router = APIRouter(responses=error_responses(400, 404, 413))


@router.post("/tokenize")
async def tokenize(req: P.TokenizeRequest, state: State) -> dict[str, Any]:
    m = state.model_for(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise P.APIError(400, "prompt: give exactly one of prompt or messages", "prompt")
    if req.messages is not None:
        ids = await chat_ids(state, m, [x.as_dict() for x in req.messages], req.add_generation_prompt)
    else:
        ids = await encode(m, req.prompt or "", "prompt", None if req.add_special_tokens else False)
    return {"tokens": ids, "count": len(ids), "max_model_len": m.max_model_len}


@router.post("/detokenize")
async def detokenize(req: P.DetokenizeRequest, state: State) -> dict[str, Any]:
    m = state.model_for(req.model)
    vocab = m.engine.engine.model_config.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise P.APIError(400, f"tokens: ids must be in 0..{vocab - 1}, got {bad[:5]}", "tokens")
    return {"prompt": m.tokenizer.decode(req.tokens)}
