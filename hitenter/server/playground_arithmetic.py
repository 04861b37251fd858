"""Why temperature 0 can change with the batch on other servers, measured on the served model's own LM head.

For each step of an answer, the row that predicted it (the final-normed hidden state of a traced forward,
hitenter/models/trace.py) is turned into logits twice by each of two arithmetics:

- ``engine``: the model's own ``compute_logits`` (this server's: row-padded, batch invariant), the row alone
  and the same row among ``others`` other rows;
- ``plain``: a dense fp32 GEMM with the LM head's weights (dequantized), as a server on dense weights without
  batch invariance computes it: the row alone (one-row GEMM) and among the others (an N-row GEMM, which
  the BLAS library may reduce in another order).

Per step: how many of the vocabulary's logits differ in any bit, the largest difference, the margin
between the top two logits, and whether the top token (the greedy choice) flips. A flip needs a margin
below the difference; ``near_tie`` adds one row built so that two tokens' logits are equal to within
rounding (said so on the page), where the plain arithmetic's order decides which one wins.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from fastapi import APIRouter, HTTPException, Request

from hitenter.models.trace import trace_forward
from hitenter.server.playground_models import MAX_TRACE_TOKENS, ArithmeticBody, body_doc, parse
from hitenter.server.playground_trace import Traces

VOCAB_CHUNK = 8192          # LM head rows dequantized at once (memory bound for large vocabularies)


def _head_parts(model: Any) -> list[Any]:
    """The LM head's weights: its GGUF block parts, its plain weight, or (a packed oneDNN weight) the exact
    dense matrix read back through the head itself (each row of the identity picks one column: one product
    per output, no rounding)."""
    head = model.head
    parts = getattr(head, "parts", None)
    if parts is not None:
        return list(parts)
    if getattr(head, "weight", None) is not None:
        return [head.weight.detach()]
    eye = torch.eye(head.in_features, dtype=model.dtype)
    with torch.inference_mode():
        w = (head(eye) - head(torch.zeros_like(eye))).float()          # [in, out]; the bias cancels
    return [w.t().contiguous()]


def _dense_rows(part: Any, lo: int, hi: int) -> torch.Tensor:
    if isinstance(part, torch.Tensor):
        return part[lo:hi].float()
    return part.dequantize(torch.arange(lo, hi)).float()


def dense_head(model: Any) -> list[torch.Tensor]:
    """The LM head's weights as fp32 chunks of at most VOCAB_CHUNK rows, in vocabulary order."""
    return [_dense_rows(part, lo, min(part.shape[0], lo + VOCAB_CHUNK))
            for part in _head_parts(model) for lo in range(0, part.shape[0], VOCAB_CHUNK)]


def plain_logits(model: Any, rows: torch.Tensor, head: list[torch.Tensor]) -> torch.Tensor:
    """Dense fp32 GEMM of ``rows`` [N, dim] with the LM head ``head`` (dense_head), scaled and capped as the
    model says."""
    logits = torch.cat([torch.nn.functional.linear(rows.float(), w) for w in head], dim=1)
    cfg = model.config
    if cfg.logit_scale != 1.0:
        logits = logits * cfg.logit_scale
    cap = cfg.final_logit_softcap
    return torch.tanh(logits / cap) * cap if cap > 0 else logits


def near_tie_row(model: Any, row: torch.Tensor, batch: torch.Tensor, head: list[torch.Tensor],
                 attempts: int = 6) -> tuple[torch.Tensor, int]:
    """``row`` moved along the difference ``d`` of its two top tokens' LM-head rows until their logits are
    equal to within the rounding (the component along ``d`` removed, then shifted by a few rounding-sized
    steps): the first such row whose greedy choice differs between the plain one-row and N-row GEMMs (with
    ``batch``'s other rows), else the last tried; and the attempts it took."""
    top = plain_logits(model, row[None], head)[0].topk(2).indices.tolist()
    full = torch.cat(head)
    d = full[top[0]] - full[top[1]]
    base = row.float() - (row.float() @ d) / (d @ d) * d
    step = d / (d @ d) * 1e-6
    tried = base
    for k in range(attempts):
        tried = base + (k - attempts // 2) * step
        alone = plain_logits(model, tried[None], head)[0]
        batched = plain_logits(model, torch.cat([tried[None], batch.float()]), head)[0]
        if int(alone.argmax()) != int(batched.argmax()):
            return tried, k + 1
    return tried, attempts


def _compare(alone: torch.Tensor, batched: torch.Tensor) -> dict[str, Any]:
    top2 = alone.topk(2)
    return {"bits_differ": int((alone != batched).sum()), "max_diff": float((alone - batched).abs().max()),
            "margin": float(top2.values[0] - top2.values[1]), "top_alone": int(top2.indices[0]),
            "top_batched": int(batched.argmax()), "flip": int(top2.indices[0]) != int(batched.argmax())}


def compare_steps(model: Any, rows: torch.Tensor, others: int, near_tie: bool = False) -> list[dict[str, Any]]:
    """Each row alone against the same row first in a batch with ``others`` other rows (the other steps'
    rows, cycled), in the engine's arithmetic and the plain one. ``near_tie`` appends a near-tie row."""
    head = dense_head(model)
    tries = 0
    if near_tie:
        others_of_last = rows[[j % rows.shape[0] for j in range(others)]]
        tie, tries = near_tie_row(model, rows[-1], others_of_last, head)
        rows = torch.cat([rows, tie[None].to(rows.dtype)])
    n = rows.shape[0]
    out = []
    with torch.inference_mode():
        for i in range(n):
            idx = [i] + [(i + 1 + j) % n for j in range(others)]
            batch = rows[idx]
            eng_alone, eng_batch = model.compute_logits(batch[:1])[0], model.compute_logits(batch)[0]
            pl_alone, pl_batch = plain_logits(model, batch[:1], head)[0], plain_logits(model, batch, head)[0]
            tie = near_tie and i == n - 1
            out.append({"step": i, "near_tie": tie, "attempts": tries if tie else 0, "rows": len(idx),
                        "engine": _compare(eng_alone, eng_batch), "plain": _compare(pl_alone, pl_batch)})
    return out


def arithmetic_routes(router: APIRouter, T: Traces) -> None:
    @router.post("/determinism/arithmetic", openapi_extra=body_doc(ArithmeticBody))
    async def arithmetic(request: Request) -> dict[str, Any]:
        """The answer's steps alone vs among ``others`` rows, in this server's arithmetic and a plain one
        (compare_steps); a long prompt is traced on its last tokens (``window_start`` says from where)."""
        body = await parse(request, ArithmeticBody)
        model, eng = T.model_of(body.model), T.pg.engine_of(body.model)
        ids = T.pg.prompt_ids_of(eng, body)[0] + list(body.answer)
        if len(ids) < 2:
            raise HTTPException(400, "determinism/arithmetic: needs a prompt token before the answer")
        start = max(0, len(ids) - MAX_TRACE_TOKENS)
        window = ids[start:]
        n = min(len(body.answer), len(window) - 1)
        async with T.one_at_a_time:
            tr = await asyncio.to_thread(trace_forward, model, window)
            rows = tr.final_normed[len(window) - n - 1 : len(window) - 1]
            steps = await asyncio.to_thread(compare_steps, model, rows, body.others, body.near_tie)
        return {"steps": steps, "others": body.others, "window_start": start, "traced": len(window),
                "answer": list(body.answer[-n:])}
