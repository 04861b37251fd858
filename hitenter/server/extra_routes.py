"""Routes beyond completions/chat: ``GET /v1/models/{id}``, ``GET /tokenizer_info`` (lm-eval's remote
tokenizer), ``POST /v1/embeddings``, and the JSON 404 fallbacks.

``include_extra_routes(app)`` must run before the playground's static mount at ``/`` (which would
otherwise answer unknown POSTs with 405): it registers these routes plus a catch-all for every method
under ``/v1/`` and for non-GET methods anywhere, both answering 404 in the API's error shape.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Any, Literal

import numpy as np
import torch
from annotated_types import MinLen
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ConfigDict

from hitenter.server import protocol as P
from hitenter.server.errors import error_responses
from hitenter.server.prompt_logprobs import forward_hidden
from hitenter.server.state import model_card, server_state

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
MAX_EMBED_INPUTS = 2048


class EmbeddingRequest(BaseModel):
    # strict like /v1's other bodies: no bools for token ids; unknown fields 400 (check_known_fields)
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    input: (P.NonEmpty | Annotated[list[P.NonEmpty], MinLen(1)] | Annotated[list[P.TokenId], MinLen(1)]
            | Annotated[list[Annotated[list[P.TokenId], MinLen(1)]], MinLen(1)])
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"   # the openai client asks for base64 by default
    dimensions: P.PositiveInt | None = None
    user: str | None = None


def _served(request: Request, name: str | None) -> Any:
    return server_state(request).model_for(name)     # the same 404 as the /v1 routes


def _embed_inputs(req: EmbeddingRequest, tok: Any, vocab: int) -> list[list[int]]:
    x = req.input
    items: list[Any] = [x] if isinstance(x, str) or (isinstance(x, list) and x and isinstance(x[0], int)) else x
    if not items or len(items) > MAX_EMBED_INPUTS:
        raise P.APIError(400, f"input: give 1..{MAX_EMBED_INPUTS} inputs", "input")
    out = []
    for it in items:
        ids = tok.encode(it) if isinstance(it, str) else list(it)
        if not ids:
            raise P.APIError(400, "input: an input is empty", "input")
        if any(not 0 <= t < vocab for t in ids):
            raise P.APIError(400, f"input: token ids must be in 0..{vocab - 1}", "input")
        out.append(ids)
    return out


def _pool(hidden: list[torch.Tensor]) -> list[list[float]]:
    """Mean over the tokens of the final (normed) hidden states, then L2-normalized."""
    return [torch.nn.functional.normalize(h.float().mean(dim=0), dim=0).tolist() for h in hidden]


def make_router() -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, Any]:
        return model_card(_served(request, model_id))

    @router.get("/tokenizer_info")
    async def tokenizer_info(request: Request, model: str | None = None) -> dict[str, Any]:
        m = _served(request, model)
        tok = m.tokenizer

        def piece(i: int | None) -> str | None:
            return None if i is None else tok.token_bytes(i).decode("utf-8", "replace")

        return {"model": m.name, "tokenizer_class": "hitenter.BPE (GGUF)", "vocab_size": tok.vocab_size,
                "eos_token": piece(tok.eos_token_id), "bos_token": piece(tok.bos_token_id),
                "pad_token": piece(tok.eos_token_id), "add_bos_token": tok.add_bos,
                "chat_template": tok.chat_template, "model_max_length": m.engine.engine.max_model_len}

    @router.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request) -> dict[str, Any]:
        from hitenter.server.request_extras import check_known_fields

        check_known_fields(req)
        m = _served(request, req.model)
        eng = m.engine.engine
        size = eng.model_config.hidden_size
        if req.dimensions is not None and req.dimensions != size:
            raise P.APIError(400, f"dimensions: the embedding size is the model's hidden size ({size}); omit it",
                             "dimensions")
        prompts = _embed_inputs(req, m.tokenizer, eng.model_config.vocab_size)
        too_long = [len(p) for p in prompts if len(p) > eng.max_model_len]
        if too_long:
            raise P.APIError(400, f"input: {too_long[0]} tokens exceed max_model_len {eng.max_model_len}", "input")
        try:
            hidden = await asyncio.to_thread(forward_hidden, eng, prompts)   # a private KV cache, beside the steps
        except ValueError as e:
            raise P.APIError(400, str(e), "input") from e
        vecs: list[Any] = _pool(hidden)
        if req.encoding_format == "base64":      # OpenAI's: the float32 little-endian bytes, base64
            vecs = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vecs]
        n = sum(map(len, prompts))
        return {"object": "list", "model": m.name, "usage": {"prompt_tokens": n, "total_tokens": n},
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]}

    return router


def include_extra_routes(app: FastAPI, guarded: dict[str, Any] | None = None) -> None:
    """The routes above, behind the API key when there is one (``guarded``: include_router's kwargs)."""
    kw = dict(guarded or {})
    kw["responses"] = {**error_responses(400, 404, 413), **kw.get("responses", {})}
    app.include_router(make_router(), **kw)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the app's documented routes take at ``path`` (empty: no route there)."""
    methods = getattr(app.state, "route_methods", None)
    if methods is None:
        methods = {p: sorted(m.upper() for m in ops) for p, ops in app.openapi()["paths"].items()}
        app.state.route_methods = methods
    return methods.get(path, [])


def not_found_or_405(app: FastAPI, method: str, path: str) -> P.APIError:
    """405 with ``Allow`` for a known path asked with another method, else our JSON 404."""
    allowed = allowed_methods(app, path)
    if allowed:
        return P.APIError(405, "Method Not Allowed", headers={"Allow": ", ".join(allowed)})
    return P.APIError(404, f"no route {method} {path}")
