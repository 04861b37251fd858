"""vLLM's /tokenize and /detokenize (their request schemas), and /tokenizer_info
(lm-eval's remote tokenizer)."""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import MinLen
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from hitenter.server.api_error import APIError, error_responses
from hitenter.server.generation import State, chat_ids, encode
from hitenter.server.protocol_openai import ChatMessage
from hitenter.server.schema_types import (
    Bool,
    TokenId,
)


class TokenizeRequest(BaseModel):
    """Exactly one of ``prompt`` or ``messages`` (neither may be null)."""
    model_config = ConfigDict(extra="ignore", json_schema_extra={"oneOf": [{"required": ["prompt"]},
                                                                        {"required": ["messages"]}]})
    model: str | None = None
    prompt: str = None                                                 # type: ignore[assignment]
    messages: Annotated[list[ChatMessage], MinLen(1)] = None           # type: ignore[assignment]
    add_generation_prompt: Bool = True
    add_special_tokens: Bool = True      # False: no BOS (lm-eval's remote tokenizer sends it)


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[TokenId]


router = APIRouter(responses=error_responses(400, 404, 413))


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, state: State) -> dict[str, Any]:
    m = await state.model_for(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "prompt: give exactly one of prompt or messages", "prompt")
    if req.messages is not None:
        ids = await chat_ids(state, m, [x.as_dict() for x in req.messages], req.add_generation_prompt)
    else:
        ids = await encode(m, req.prompt or "", "prompt", None if req.add_special_tokens else False)
    return {"tokens": ids, "count": len(ids), "max_model_len": m.max_model_len}


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, state: State) -> dict[str, Any]:
    m = await state.model_for(req.model)
    bad = [t for t in req.tokens if not 0 <= t < m.vocab_size]
    if bad:
        raise APIError(400, f"tokens: ids must be in 0..{m.vocab_size - 1}, got {bad[:5]}", "tokens")
    return {"prompt": m.tokenizer.decode(req.tokens)}


@router.get("/tokenizer_info")
async def tokenizer_info(state: State, model: str | None = None) -> dict[str, Any]:
    m = await state.model_for(model)
    tok = m.tokenizer

    def piece(i: int | None) -> str | None:
        return None if i is None else tok.token_bytes(i).decode("utf-8", "replace")

    return {"model": m.name, "tokenizer_class": "hitenter.BPE (GGUF)", "vocab_size": tok.vocab_size,
            "eos_token": piece(tok.eos_token_id), "bos_token": piece(tok.bos_token_id),
            "pad_token": piece(tok.eos_token_id), "add_bos_token": tok.add_bos,
            "chat_template": tok.chat_template, "model_max_length": m.max_model_len}
