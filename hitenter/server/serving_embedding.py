"""POST /v1/embeddings: each input's vector by the model's own pooling (the file's ``pooling_type``: mean,
cls or last, then its dense heads; a decoder whose file says nothing: mean), L2-normalized; engine work
scheduled between its steps (EngineClient.embed). ``encoding_format`` ``float`` or ``base64`` (the float32
little-endian bytes; the openai client asks for it by default). ``dimensions`` (Matryoshka): the first
``dimensions`` values renormalized, for models whose file states their pooling (embedding models); others
allow only their own size. A model with pooling none (one vector per token) or rank (a reranker: scores,
/v1/rerank) is refused with a 400, as llama-server does."""

from __future__ import annotations

import base64
from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from annotated_types import MinLen
from fastapi import APIRouter, Request
from pydantic import ConfigDict

from hitenter.server.api_error import APIError, check_known_fields, error_responses
from hitenter.server.generation import ServedModel, State, check_ids, until_disconnected
from hitenter.server.schema_types import Lenient, NonEmpty, PositiveInt, TokenId
from hitenter.tokenizer.ugm import UgmTokenizer
from hitenter.tokenizer.wordpiece import WordPieceTokenizer

MAX_EMBED_INPUTS = 2048
router = APIRouter(responses=error_responses(400, 404, 413))


class EmbeddingRequest(Lenient):
    # strict like /v1's other bodies: no bools for token ids; unknown fields 400 (check_known_fields)
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    input: (NonEmpty | Annotated[list[NonEmpty], MinLen(1)] | Annotated[list[TokenId], MinLen(1)]
            | Annotated[list[Annotated[list[TokenId], MinLen(1)]], MinLen(1)])
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: str | None = None


def text_ids(tok: Any, text: str) -> list[int]:
    """An input text's tokens as llama.cpp's embedding mode gives them (``add_special``): the tokenizer's, and
    EOS after them where the file asks for one (``add_eos_token``, e.g. Qwen3-Embedding's <|endoftext|>, the
    token its last-token pooling reads). The unigram and WordPiece tokenizers add their own end tokens."""
    ids = list(tok.encode(text))
    eos = getattr(tok, "eos_token_id", None)
    if getattr(tok, "add_eos", False) and eos is not None and not isinstance(tok, (UgmTokenizer, WordPieceTokenizer)):
        ids.append(eos)
    return ids


def embed_inputs(m: ServedModel, x: str | list[Any], param: str = "input") -> list[list[int]]:
    """Token ids of 1..MAX_EMBED_INPUTS inputs (texts or ids), each non-empty and inside the window."""
    items: list[Any] = [x] if isinstance(x, str) or (isinstance(x, list) and x and isinstance(x[0], int)) else x
    if not items or len(items) > MAX_EMBED_INPUTS:
        raise APIError(400, f"{param}: give 1..{MAX_EMBED_INPUTS} inputs", param)
    out = []
    for it in items:
        ids = text_ids(m.tokenizer, it) if isinstance(it, str) else list(it)
        if not ids:
            raise APIError(400, f"{param}: an input is empty", param)
        check_ids(m, ids, param)
        out.append(ids)
    return out


def check_embedding_model(m: ServedModel, dimensions: int | None) -> None:
    """A 400 unless the model gives one vector per input, and ``dimensions`` (when given) is one it allows."""
    info = m.client.info
    if info.pooling in ("none", "rank"):
        what = ("a reranker (pooling rank): it scores query-document pairs, use /v1/rerank"
                if info.pooling == "rank" else "pooling none: one vector per token, none per input")
        raise APIError(400, f"model: {m.name} has no embeddings to give: {what}", "model")
    size = info.embedding_size or info.hidden_size
    if dimensions is None or dimensions == size:
        return
    if not info.pooling_from_file:
        raise APIError(400, f"dimensions: the embedding size is the model's hidden size ({size}); omit it",
                       "dimensions")
    if dimensions > size:
        raise APIError(400, f"dimensions: at most the model's embedding size ({size})", "dimensions")


T = TypeVar("T")


async def pooled(request: Request | None, work: Awaitable[T]) -> T:
    """``work``'s result; when ``request``'s client goes away first the work is cancelled (its engine job is
    dropped before its next forward) and the request ends with 499, nothing sent."""
    if request is None:
        return await work
    out = await until_disconnected(request, work)
    if out is None:
        raise APIError(499, "the client closed the connection before the work finished")
    return out


async def embed(m: ServedModel, prompts: list[list[int]], param: str = "input", dimensions: int | None = None,
                request: Request | None = None) -> list[list[float]]:
    """L2-normalized vectors of the prompts; with ``dimensions``, their first values renormalized; the work
    stops when ``request``'s client leaves (``pooled``)."""
    try:
        vecs = await pooled(request, m.client.embed(prompts))
    except ValueError as e:
        raise APIError(400, str(e), param) from e
    if dimensions is None or dimensions >= len(vecs[0]):
        return vecs
    cut = np.asarray(vecs, dtype=np.float64)[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.where(norms > 0, norms, 1.0)).tolist()   # type: ignore[no-any-return]


def b64(vec: list[float]) -> str:
    return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")


@router.post("/v1/embeddings")
async def embeddings(req: EmbeddingRequest, state: State, request: Request) -> dict[str, Any]:
    check_known_fields(req)
    m = await state.model_for(req.model)
    check_embedding_model(m, req.dimensions)
    prompts = embed_inputs(m, req.input)
    vecs: list[Any] = await embed(m, prompts, dimensions=req.dimensions, request=request)
    if req.encoding_format == "base64":
        vecs = [b64(v) for v in vecs]
    n = sum(map(len, prompts))
    return {"object": "list", "model": m.name, "usage": {"prompt_tokens": n, "total_tokens": n},
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]}
