"""The playground's "inside the model" routes: traced forwards of the served model (hitenter/models/trace.py)
and what the panels draw from them. A trace runs in a worker thread on the model's weights (EngineInspector.model()), outside the
engine's scheduler and KV cache: requests that are not traced are not held up by it.

POST /trace makes one (prompt <= MAX_TRACE_TOKENS tokens; a longer one with ``last``: its last tokens, run as a
prompt of their own, ``offset`` saying how many came before) and returns its id and summaries; the other
routes read a kept trace (the last MAX_TRACES) by id: /trace/attention (one layer, all heads),
/trace/embedding, /trace/lens (residual norms and the logit lens), /trace/logits, /trace/heads (one query's
row in every layer and head), /trace/head (q·k/√d and the value mix of one head), /trace/ffn (the norm and feed-forward block of one
token at one layer, playground_ffn.py) and /trace/parts (attention's
and the MLP's additions to the residual stream, playground_heads.py); /trace/rope, /trace/compare and /trace/order (word order against positions)
need only a model; /fast is the "making it faster" panel's facts about the served model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any

import torch
from fastapi import APIRouter, HTTPException, Request

from hitenter.models.attention import KEY_TILE
from hitenter.models.trace import (
    Trace,
    embedding_table,
    logit_lens,
    nearest_tokens,
    trace_forward,
    trace_with_generation,
    traceable,
)
from hitenter.server.playground_ffn import ffn_view
from hitenter.server.playground_heads import head_kinds, head_row, layer_parts, strongest_content_head
from hitenter.server.playground_models import (
    MAX_TRACE_TOKENS,
    CompareBody,
    HeadQuery,
    OrderBody,
    ProbeBody,
    RopeBody,
    TraceBody,
    TraceQuery,
    body_doc,
    parse,
)
from hitenter.server.playground_state import Playground
from hitenter.server.playground_util import piece

MAX_TRACES = 8


def r4(x: torch.Tensor) -> Any:
    """A tensor as nested lists rounded to 4 decimals (JSON size)."""
    return (x.float() * 1e4).round().div(1e4).tolist()


@cache
def copy_bandwidth() -> float:
    """Measured memory bandwidth of this machine in bytes/s (one 64 MiB copy: read + write), once."""
    a = torch.empty(16 << 20, dtype=torch.float32)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.numel() * 4 / best


class Traces:
    def __init__(self, pg: Playground) -> None:
        self.pg = pg
        self.kept: OrderedDict[str, tuple[str, Trace]] = OrderedDict()
        self.norms: dict[int, torch.Tensor] = {}
        self.one_at_a_time = asyncio.Semaphore(1)    # traced forwards share the CPU with the engine: one at once

    def model_of(self, name: str | None) -> Any:
        model = self.pg.engine_of(name).inspector.model()
        if not traceable(model):
            raise HTTPException(400, f"model {name!r}: its layers cannot be traced (the trigram toy has none; a hybrid "
                                     "model's recurrent layers have no attention map): the inside panels need a "
                                     "transformer")
        return model

    def get(self, trace_id: str) -> tuple[str, Trace, Any]:
        if trace_id not in self.kept:
            raise HTTPException(404, "no such trace (only the last few are kept): make one with POST /trace")
        name, tr = self.kept[trace_id]
        return name, tr, self.pg.engine_of(name)

    def keep(self, name: str, tr: Trace) -> str:
        tid = f"tr-{uuid.uuid4().hex[:10]}"
        self.kept[tid] = (name, tr)
        while len(self.kept) > MAX_TRACES:
            self.kept.popitem(last=False)
        return tid


def summary(tid: str, tr: Trace, client: Any) -> dict[str, Any]:
    cfg, tok = client.info, client.tokenizer
    p = torch.softmax(tr.logits[-1], -1)
    top_p, top_i = p.topk(10)
    return {"trace_id": tid, "pieces": [piece(tok, t) for t in tr.token_ids], "num_prompt": tr.num_prompt,
            "generated": tr.generated, "layers": cfg.num_layers, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "dim": cfg.hidden_size, "vocab": cfg.vocab_size,
            "norms": r4(tr.hidden.norm(dim=-1)),
            "next": [{"piece": piece(tok, int(i)), "p": float(q), "logit": float(tr.logits[-1, i])}
                     for q, i in zip(top_p, top_i, strict=True)]}


def _index(tr: Trace, i: int) -> int:
    if i >= len(tr.token_ids):
        raise HTTPException(400, f"index: {i} is past the last token ({len(tr.token_ids) - 1})")
    return i


def _make_routes(router: APIRouter, T: Traces) -> None:
    @router.post("/trace", openapi_extra=body_doc(TraceBody))
    async def trace(request: Request) -> dict[str, Any]:
        body = await parse(request, TraceBody)
        model = T.model_of(body.model)
        eng = T.pg.engine_of(body.model)
        ids, _ = T.pg.prompt_ids_of(eng, body)
        room = MAX_TRACE_TOKENS - body.generate
        offset = max(0, len(ids) - room) if body.last else 0      # prompt tokens left out before the traced ones
        if not ids or len(ids) - offset > room:
            raise HTTPException(400, f"trace: {len(ids)} prompt tokens (+{body.generate}); 1 to {MAX_TRACE_TOKENS} "
                                     "are traced (last: true traces the last ones)")
        async with T.one_at_a_time:
            tr = await asyncio.to_thread(trace_with_generation, model, ids[offset:], body.generate,
                                         frozenset(eng.tokenizer.eog_token_ids))
        return {**summary(T.keep(str(body.model), tr), tr, eng), "offset": offset, "num_prompt_total": len(ids)}

    @router.post("/trace/attention", openapi_extra=body_doc(TraceQuery))
    async def attention(request: Request) -> dict[str, Any]:
        q = await parse(request, TraceQuery)
        _, tr, _ = T.get(q.trace_id)
        if q.layer >= tr.attentions.shape[0]:
            raise HTTPException(400, f"layer: {q.layer} >= {tr.attentions.shape[0]} layers")
        return {"layer": q.layer, "probs": r4(tr.attentions[q.layer])}

    @router.post("/trace/embedding", openapi_extra=body_doc(TraceQuery))
    async def embedding(request: Request) -> dict[str, Any]:
        q = await parse(request, TraceQuery)
        _, tr, eng = T.get(q.trace_id)
        i = _index(tr, q.index)
        vec = tr.embeddings[i]
        ids, sims = await asyncio.to_thread(nearest_tokens, eng.inspector.model(), vec, 8, T.norms)
        return {"index": i, "piece": piece(eng.tokenizer, tr.token_ids[i]), "vector": r4(vec), "norm": float(vec.norm()),
                "nearest": [{"piece": piece(eng.tokenizer, t), "cos": s} for t, s in zip(ids, sims, strict=True)]}

    @router.post("/trace/probe", openapi_extra=body_doc(ProbeBody))
    async def probe(request: Request) -> dict[str, Any]:
        """A typed word's row of the embedding table (its first token's, as the word reads after a space inside a
        sentence; all its tokens listed) and the rows nearest it by cosine similarity."""
        b = await parse(request, ProbeBody)
        model, tok = T.model_of(b.model), T.pg.engine_of(b.model).tokenizer
        ids = tok.encode(" " + b.word.strip(), add_bos=False, parse_special=False)
        if not b.word.strip() or not ids:
            raise HTTPException(400, "word: type a word (letters, not only spaces)")
        vec = embedding_table(model)[ids[0]].float()
        near, sims = await asyncio.to_thread(nearest_tokens, model, vec, 9, T.norms)
        return {"word": b.word.strip(), "pieces": [piece(tok, t) for t in ids], "id": ids[0], "norm": float(vec.norm()),
                "nearest": [{"piece": piece(tok, t), "cos": s} for t, s in zip(near, sims, strict=True)]}

    @router.post("/trace/lens", openapi_extra=body_doc(TraceQuery))
    async def lens(request: Request) -> dict[str, Any]:
        q = await parse(request, TraceQuery)
        _, tr, eng = T.get(q.trace_id)
        i = _index(tr, q.index)
        probs, ids = await asyncio.to_thread(logit_lens, eng.inspector.model(), tr.hidden[:, i])
        return {"index": i, "norms": r4(tr.hidden[:, i].norm(dim=-1)),
                "top": [[{"piece": piece(eng.tokenizer, int(t)), "p": float(p)} for p, t in zip(pr, row, strict=True)]
                        for pr, row in zip(probs, ids, strict=True)]}

    @router.post("/trace/heads", openapi_extra=body_doc(TraceQuery))
    async def heads(request: Request) -> dict[str, Any]:
        """One query token's attention row in every layer and head (the thumbnail grid), what each head does
        (previous-token, first-token sink, self or content: playground_heads.head_kinds, measured over this
        trace), and the query's strongest content head: its most weight on one earlier token (not the first
        token, not itself) among the content heads."""
        q = await parse(request, TraceQuery)
        _, tr, _ = T.get(q.trace_id)
        i = _index(tr, q.index)
        rows = tr.attentions[:, :, i, : i + 1].float()          # [layers, heads, i + 1]
        kinds = head_kinds(tr.attentions)
        return {"index": i, "probs": (rows * 1e3).round().div(1e3).tolist(), **kinds,
                "strongest": strongest_content_head(tr.attentions, kinds["kinds"], i)}

    @router.post("/trace/head", openapi_extra=body_doc(HeadQuery))
    async def head(request: Request) -> dict[str, Any]:
        """One query in one head: q·k/√d per key, softmax, each key's share of the value mix."""
        q = await parse(request, HeadQuery)
        name, tr, _ = T.get(q.trace_id)
        model = T.model_of(name)
        if q.layer >= len(model.layers) or q.head >= model.layers[q.layer].num_heads:
            raise HTTPException(400, f"layer/head: ({q.layer}, {q.head}) is outside {len(model.layers)} layers "
                                     f"x {model.layers[0].num_heads} heads")
        i = _index(tr, q.index)
        async with T.one_at_a_time:
            return await asyncio.to_thread(head_row, model, tr, q.layer, q.head, i)

    @router.post("/trace/parts", openapi_extra=body_doc(TraceQuery))
    async def parts(request: Request) -> dict[str, Any]:
        """A token's residual stream split per layer into what attention added and what the MLP added."""
        q = await parse(request, TraceQuery)
        name, tr, _ = T.get(q.trace_id)
        model, i = T.model_of(name), _index(tr, q.index)
        async with T.one_at_a_time:
            return await asyncio.to_thread(layer_parts, model, tr, i)

    @router.post("/trace/ffn", openapi_extra=body_doc(TraceQuery))
    async def ffn(request: Request) -> dict[str, Any]:
        """One token at one layer: the norm before the feed-forward block and the block's neurons (playground_ffn)."""
        q = await parse(request, TraceQuery)
        name, tr, _ = T.get(q.trace_id)
        model, i = T.model_of(name), _index(tr, q.index)
        if q.layer >= len(model.layers):
            raise HTTPException(400, f"layer: {q.layer} >= {len(model.layers)} layers")
        try:
            async with T.one_at_a_time:
                return await asyncio.to_thread(ffn_view, model, tr, q.layer, i)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e

    @router.post("/trace/logits", openapi_extra=body_doc(TraceQuery))
    async def logits(request: Request) -> dict[str, Any]:
        q = await parse(request, TraceQuery)
        _, tr, eng = T.get(q.trace_id)
        row = tr.logits[_index(tr, q.index)]
        top_l, top_i = row.topk(12)
        t = max(q.temperature, 1e-4)
        p1, pt = torch.softmax(row, -1), torch.softmax(row / t, -1)
        return {"index": q.index, "temperature": q.temperature, "logsumexp": float(torch.logsumexp(row, -1)),
                "rows": [{"piece": piece(eng.tokenizer, int(i)), "logit": float(v), "p": float(p1[i]), "p_t": float(pt[i])}
                         for v, i in zip(top_l, top_i, strict=True)]}


def _model_routes(router: APIRouter, T: Traces) -> None:
    @router.post("/trace/rope", openapi_extra=body_doc(RopeBody))
    async def rope(request: Request) -> dict[str, Any]:
        """RoPE of the real model: each dimension pair's angle per position, and how the score of a
        query and key that are the same vector falls off with their distance (mean of cos(d * theta_i))."""
        body = await parse(request, RopeBody)
        inv = T.model_of(body.model).rope.inv_freq.float()
        d = torch.arange(body.max_distance + 1, dtype=torch.float32)
        return {"inv_freq": inv.tolist(), "head_dim": 2 * inv.numel(),
                "angles": r4(torch.outer(torch.arange(body.positions, dtype=torch.float32), inv)),
                "decay": r4(torch.cos(torch.outer(d, inv)).mean(-1))}

    @router.post("/trace/compare", openapi_extra=body_doc(CompareBody))
    async def compare(request: Request) -> dict[str, Any]:
        """The same word in two sentences: cosine of its hidden states layer by layer (identical at the
        embedding, pulled apart by attention to its context), and where it looks in the last layer."""
        body = await parse(request, CompareBody)
        model, eng = T.model_of(body.model), T.pg.engine_of(body.model)
        tok, out = eng.tokenizer, []
        for text in (body.a, body.b):
            ids = tok.encode(text)[:MAX_TRACE_TOKENS]
            at = [i for i, t in enumerate(ids) if tok.decode([t]).strip() == body.word]
            if not at:
                raise HTTPException(400, f"compare: {body.word!r} is not one token of {text!r}")
            async with T.one_at_a_time:
                tr = await asyncio.to_thread(trace_forward, model, ids)
            out.append((tr, at[-1], ids))
        (ta, ia, _), (tb, ib, _) = out
        cos = torch.cosine_similarity(ta.hidden[:, ia], tb.hidden[:, ib], dim=-1)
        return {"word": body.word, "cos": r4(cos),
                "looks": [{"pieces": [piece(tok, t) for t in ids], "at": i, "probs": r4(tr.attentions[-1, :, i, :i + 1].mean(0))}
                          for tr, i, ids in out]}

    @router.post("/trace/order", openapi_extra=body_doc(OrderBody))
    async def order(request: Request) -> dict[str, Any]:
        """The same words in another order: the same embedding rows (a bag of vectors is the same bag), yet
        each word's hidden state and the next-token prediction differ, because positions enter attention."""
        body = await parse(request, OrderBody)
        model, eng = T.model_of(body.model), T.pg.engine_of(body.model)
        tok, runs = eng.tokenizer, []
        for text in (body.a, body.b):
            ids = tok.encode(text)[:MAX_TRACE_TOKENS]
            if not ids:
                raise HTTPException(400, "order: an empty sentence")
            async with T.one_at_a_time:
                runs.append((ids, await asyncio.to_thread(trace_forward, model, ids)))
        (ia, ta), (ib, tb) = runs
        pairs, used = [], set()
        for i, t in enumerate(ia):             # each token of a, matched to the same id in b
            j = next((j for j, u in enumerate(ib) if u == t and j not in used), None)
            if j is not None:
                used.add(j)
                cos = torch.cosine_similarity(ta.hidden[:, i], tb.hidden[:, j], dim=-1)
                pairs.append({"a": i, "b": j, "piece": piece(tok, t), "cos": r4(cos)})

        def side(ids: list[int], tr: Trace) -> dict[str, Any]:
            p = torch.softmax(tr.logits[-1].float(), -1)
            top_p, top_i = p.topk(5)
            return {"pieces": [piece(tok, t) for t in ids],
                    "next": [{"piece": piece(tok, int(k)), "p": float(v)} for v, k in zip(top_p, top_i, strict=True)]}

        bag = torch.cosine_similarity(ta.hidden[:, :].mean(1), tb.hidden[:, :].mean(1), dim=-1)
        return {"a": side(ia, ta), "b": side(ib, tb), "same_bag": sorted(ia) == sorted(ib), "pairs": pairs,
                "bag_cos": r4(bag)}

    @router.get("/fast")
    async def fast(model: str | None = None) -> dict[str, Any]:
        c = T.pg.engine_of(model)
        i, spec = c.info, c.spec_stats()
        return {**c.inspector.facts(), "kv_bytes_per_token": i.kv_bytes_per_token,
                "bandwidth": await asyncio.to_thread(copy_bandwidth), "key_tile": KEY_TILE,
                "max_model_len": i.max_model_len, "context_length": i.context_length,
                "parameter_count": i.parameter_count, "file_size": i.file_size,
                "file": Path(i.path).name if i.path else None, "layers": i.num_layers, "kv_heads": i.num_kv_heads,
                "head_dim": i.head_dim, "hidden": i.hidden_size,
                "spec_stats": None if spec is None else {
                    "drafts": spec.num_drafts, "draft_tokens": spec.num_draft_tokens,
                    "accepted_tokens": spec.num_accepted_tokens, "acceptance_rate": spec.acceptance_rate,
                    "accepted_per_position": list(spec.num_accepted_tokens_per_pos)}}


def trace_routes(router: APIRouter, pg: Playground) -> Traces:
    """The traced-forward routes; returns their shared state (for routes that trace too)."""
    T = Traces(pg)
    _make_routes(router, T)
    _model_routes(router, T)
    return T
