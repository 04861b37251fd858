"""Prompt scoring: one model forward over whole prompts, for prompt logprobs (``echo`` + ``logprobs``,
``max_tokens=0``, vLLM's ``prompt_logprobs``) and for embeddings.

The forward runs under the engine lock (between engine steps) on a private scratch KV cache, so it
never takes prefix-cache hits and never disturbs the engine's cache: every prompt position is always
computed, and the numbers are the same whether or not the prompt's prefix is cached for generation.
Its rows take the same kernels as a prefill in the engine (the GEMM path, the last row the fused
kernel), so a prompt token's logprob equals the sampler's raw logprob for the same text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hitenter.engine.sampler import TokenLogprobs, token_logprobs
from hitenter.models.attention import AttentionMetadata, allocate_kv_caches

MAX_SCORE_TOKENS = 4096        # tokens per scoring forward (a request with more runs several)
_LOGITS_CHUNK = 256            # rows per logits GEMM (keeps [rows, V] fp32 small)


def _model_and_cache_shape(engine: Any) -> tuple[Any, int, torch.dtype, int]:
    runner = engine.runner
    caches = getattr(runner, "kv_caches", None)
    if not caches or not hasattr(runner, "model"):
        raise ValueError("prompt: prompt scoring/embeddings are not available with tensor-parallel or "
                         "disaggregated engines")
    return runner.model, int(caches[0].shape[1]), caches[0].dtype, int(runner.block_size)


@torch.inference_mode()
def _forward(engine: Any, prompts: list[list[int]]) -> list[Tensor]:
    model, kvh, dtype, bs = _model_and_cache_shape(engine)
    blocks = [math.ceil(len(p) / bs) for p in prompts]
    caches = allocate_kv_caches(engine.model_config, sum(blocks), bs, dtype, num_kv_heads=kvh)
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl, tables, first = [0], [], 0
    for p, nb in zip(prompts, blocks, strict=True):
        table = list(range(first, first + nb))
        first += nb
        ids.extend(p)
        positions.extend(range(len(p)))
        slots.extend(table[i // bs] * bs + i % bs for i in range(len(p)))
        qsl.append(qsl[-1] + len(p))
        tables.append(table)
    meta = AttentionMetadata(query_start_loc=qsl, seq_lens=[len(p) for p in prompts], block_tables=tables,
                             slot_mapping=torch.tensor(slots, dtype=torch.long), block_size=bs,
                             kernel_from=[len(p) - 1 for p in prompts], workspace={})
    hidden = model(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long), meta, caches)
    return [hidden[qsl[i]:qsl[i + 1]] for i in range(len(prompts))]


def forward_hidden(engine: Any, prompts: list[list[int]]) -> list[Tensor]:
    """Final (normed) hidden states ``[len(p), H]`` of each prompt, in forwards of <= MAX_SCORE_TOKENS."""
    out: list[Tensor] = []
    batch: list[list[int]] = []
    for p in prompts:
        if batch and sum(map(len, batch)) + len(p) > MAX_SCORE_TOKENS:
            out.extend(_forward(engine, batch))
            batch = []
        batch.append(p)
    if batch:
        out.extend(_forward(engine, batch))
    return out


@dataclass
class PromptScores:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]     # None at position 0 (nothing predicts the first token)


@torch.inference_mode()
def score_prompts(engine: Any, prompts: list[list[int]], k: int) -> list[PromptScores]:
    """Raw logprob, rank and top ``k`` of every prompt token given the tokens before it."""
    model = engine.runner.model
    out = []
    for p, h in zip(prompts, forward_hidden(engine, prompts), strict=True):
        lps: list[TokenLogprobs | None] = [None]
        for s in range(0, len(p) - 1, _LOGITS_CHUNK):
            e = min(s + _LOGITS_CHUNK, len(p) - 1)
            logits = model.compute_logits(h[s:e])
            lps.extend(token_logprobs(logits, torch.tensor(p[s + 1:e + 1], dtype=torch.long), [k] * (e - s)))
        out.append(PromptScores(p, lps))
    return out


def legacy_prompt_logprobs(sc: PromptScores, decode: Any) -> dict[str, Any]:
    """The completions ``logprobs`` object of an echoed prompt: leading null, tokens, text_offset."""
    tokens, lps, tops, offsets, offset = [], [], [], [], 0
    for tid, lp in zip(sc.token_ids, sc.logprobs, strict=True):
        piece = decode([tid])
        tokens.append(piece)
        offsets.append(offset)
        offset += len(piece)
        if lp is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(_finite(lp.logprob))
        top = {decode([t]): _finite(v) for t, v, _ in lp.top}
        top.setdefault(piece, _finite(lp.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def vllm_prompt_logprobs(sc: PromptScores, decode: Any) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: per position null (first) or {token_id: {logprob, rank, decoded_token}}."""
    out: list[dict[str, Any] | None] = []
    for tid, lp in zip(sc.token_ids, sc.logprobs, strict=True):
        if lp is None:
            out.append(None)
            continue
        d = {str(t): {"logprob": _finite(v), "rank": r, "decoded_token": decode([t])} for t, v, r in lp.top}
        d[str(tid)] = {"logprob": _finite(lp.logprob), "rank": lp.rank, "decoded_token": decode([tid])}
        out.append(d)
    return out


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0
