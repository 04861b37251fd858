"""Reranking and pair scoring: POST /v1/rerank, /rerank, /v2/rerank (llama-server's, Jina's and Cohere's
shape; TEI's with ``texts``) and /score, /v1/score (vLLM's).

A query-document pair is scored by a cross-encoder: a model whose file pools by rank (bge-reranker: BERT
with the `cls` / `cls.output` classifier; Qwen3-Reranker: the yes / no rows of its head, softmaxed), its
score the pooled output's first value, as llama-server's. The pair's tokens are llama-server's
(format_prompt_rerank): the file's `tokenizer.chat_template.rerank` with {query} and {document} replaced,
special tokens parsed, where it has one; else BOS, the query, EOS (where the vocabulary adds one; SEP in
its stead when it has no EOS), SEP (where it adds one: BERT), the document, EOS. With an embedding model
(mean, cls or last pooling) the score is the cosine similarity of the two embeddings, as vLLM scores
pairs with one. A model with pooling none is refused (400).

Bodies:
- rerank: ``query`` (string), ``documents`` (strings, or objects with ``text``) or ``texts`` (TEI),
  ``top_n`` (default all), ``return_documents`` / ``return_text``; the reply lists results by descending
  score, each with the document's ``index`` in the request and its ``relevance_score`` (TEI: a bare list
  of ``{index, score}``).
- score: ``text_1`` and ``text_2`` (or ``queries`` / ``documents``), each a string or a list: one string
  against each of a list, or two lists of the same length pairwise; the reply's ``data`` holds
  ``{index, object: "score", score}`` in input order.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from annotated_types import MinLen
from fastapi import APIRouter, Request
from pydantic import ConfigDict

from hitenter.server.api_error import APIError, check_known_fields, error_responses
from hitenter.server.generation import ServedModel, State, check_ids
from hitenter.server.schema_types import Bool, Lenient, Nested, PositiveInt
from hitenter.server.serving_embedding import MAX_EMBED_INPUTS, embed, pooled, text_ids

router = APIRouter(responses=error_responses(400, 404, 413))


class Document(Nested):
    text: str


class RerankRequest(Lenient):
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    query: str
    model: str | None = None
    documents: Annotated[list[str | Document], MinLen(1)] | None = None
    texts: Annotated[list[str], MinLen(1)] | None = None
    top_n: PositiveInt | None = None
    return_documents: Bool = False
    return_text: Bool = False


class ScoreRequest(Lenient):
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    model: str | None = None
    text_1: str | Annotated[list[str], MinLen(1)] | None = None
    text_2: str | Annotated[list[str], MinLen(1)] | None = None
    queries: str | Annotated[list[str], MinLen(1)] | None = None
    documents: str | Annotated[list[str], MinLen(1)] | None = None


def rerank_tokens(tok: Any, template: str | None, query: str, doc: str) -> list[int]:
    """llama-server's tokens for one (query, document) pair (see the module docstring)."""
    if template:
        return list(tok.encode(template.replace("{query}", query).replace("{document}", doc), add_bos=False,
                               parse_special=True))
    sep = getattr(tok, "sep_token_id", None)
    eos = tok.eos_token_id if tok.eos_token_id is not None else sep
    add_eos = bool(getattr(tok, "add_eos", False)) and eos is not None
    ids = [tok.bos_token_id] if tok.add_bos and tok.bos_token_id is not None else []
    ids += tok.encode(query, add_bos=False, parse_special=False) + ([eos] if add_eos else [])
    ids += [sep] if getattr(tok, "add_sep", False) and sep is not None else []
    return ids + tok.encode(doc, add_bos=False, parse_special=False) + ([eos] if add_eos else [])


async def score_pairs(m: ServedModel, pairs: list[tuple[str, str]], param: str,
                      request: Request | None = None) -> tuple[list[float], int]:
    """(a score per pair, tokens evaluated): the cross-encoder's, or an embedding model's cosine similarity;
    the work stops when ``request``'s client leaves (serving_embedding.pooled)."""
    info = m.client.info
    if len(pairs) > MAX_EMBED_INPUTS:
        raise APIError(400, f"{param}: at most {MAX_EMBED_INPUTS} pairs per request", param)
    if info.pooling == "none":
        raise APIError(400, f"model: {m.name} has pooling none: it gives no score for a pair", "model")
    if info.pooling == "rank":
        template = info.metadata.get("tokenizer.chat_template.rerank")
        prompts = [rerank_tokens(m.tokenizer, template if isinstance(template, str) else None, q, d)
                   for q, d in pairs]
        for p in prompts:
            check_ids(m, p, param)
        try:
            out = await pooled(request, m.client.pool(prompts))
        except ValueError as e:
            raise APIError(400, str(e), param) from e
        return [float(v[0]) for v in out], sum(map(len, prompts))
    texts = list(dict.fromkeys(t for pair in pairs for t in pair))
    prompts = [text_ids(m.tokenizer, t) for t in texts]
    for p in prompts:
        if not p:
            raise APIError(400, f"{param}: an input is empty", param)
        check_ids(m, p, param)
    vecs = dict(zip(texts, await embed(m, prompts, param, request=request), strict=True))
    return [sum(a * b for a, b in zip(vecs[q], vecs[d], strict=True)) for q, d in pairs], sum(map(len, prompts))


def _texts(req: RerankRequest) -> list[str]:
    if (req.documents is None) == (req.texts is None):
        raise APIError(400, "documents: give documents (or TEI's texts), one of them", "documents")
    docs = req.documents if req.documents is not None else req.texts
    return [d.text if isinstance(d, Document) else d for d in docs or []]


@router.post("/v1/rerank")
@router.post("/rerank")
@router.post("/v2/rerank")
async def rerank(req: RerankRequest, state: State, request: Request) -> Any:
    check_known_fields(req)
    m = await state.model_for(req.model)
    docs = _texts(req)
    scores, n_tokens = await score_pairs(m, [(req.query, d) for d in docs], "documents", request)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:req.top_n or len(docs)]
    if req.texts is not None:     # TEI's reply: a bare list
        return [{"index": i, "score": scores[i], **({"text": docs[i]} if req.return_text else {})} for i in order]
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": {"text": docs[i]}} if req.return_documents else {})} for i in order]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": req.model or m.name, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}


def _pairs(req: ScoreRequest) -> list[tuple[str, str]]:
    left = req.text_1 if req.text_1 is not None else req.queries
    right = req.text_2 if req.text_2 is not None else req.documents
    if left is None or right is None:
        raise APIError(400, "text_1: give text_1 and text_2 (or queries and documents)", "text_1")
    if isinstance(left, str):
        return [(left, r) for r in ([right] if isinstance(right, str) else right)]
    if isinstance(right, str) or len(left) != len(right):
        raise APIError(400, "text_2: with a list text_1, give a list text_2 of the same length", "text_2")
    return list(zip(left, right, strict=True))


@router.post("/score")
@router.post("/v1/score")
async def score(req: ScoreRequest, state: State, request: Request) -> dict[str, Any]:
    check_known_fields(req)
    m = await state.model_for(req.model)
    scores, n_tokens = await score_pairs(m, _pairs(req), "text_2", request)
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": req.model or m.name, "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]}
