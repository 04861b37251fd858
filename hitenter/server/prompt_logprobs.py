"""Prompt scoring: model forwards over whole prompts, for prompt logprobs (``echo`` + ``logprobs``,
``max_tokens=0``, vLLM's ``prompt_logprobs``) and for embeddings.

The forwards run on a private scratch KV cache, so they never take prefix-cache hits and never disturb
the engine's cache: every prompt position is always computed, and the numbers are the same whether or
not the prompt's prefix is cached for generation. Rows take the same kernels as a prefill in the engine
(the GEMM path, the last prompt row the fused kernel), so a prompt token's logprob equals the sampler's
raw logprob for the same text; a forward is cut into chunks of at most ``slice_tokens`` tokens (a long
prompt continues on its scratch cache, as a chunked prefill does), which batch invariance keeps bitwise
equal to one forward. ``slice_tokens`` is a number, or a callable asked before each forward (the server's
pooling share shrinks slices beside generation).

``hidden_states_job`` / ``score_job`` are generators that yield each forward's token count: the server runs
them on the engine thread one slice per engine step (hitenter/server/engine_jobs.py).
``forward_hidden`` / ``score_prompts`` run them to the end at once (a caller that owns the engine).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hitenter.engine.sampler import TokenLogprobs, token_logprobs
from hitenter.models.attention import AttentionMetadata, allocate_kv_caches, kv_tensors

MAX_SCORE_TOKENS = 4096        # tokens sharing one scratch cache (a longer prompt gets one of its own)
SLICE_TOKENS = 512             # tokens per forward when run between engine steps
_LOGITS_CHUNK = 256            # rows per logits GEMM (keeps [rows, V] fp32 small)
Job = Generator[None, None, Any]


def _model_and_cache_shape(engine: Any) -> tuple[Any, int, torch.dtype, int]:
    runner = engine.runner
    caches = kv_tensors(getattr(runner, "kv_caches", None) or [])
    if not caches or not hasattr(runner, "model"):
        raise ValueError("prompt: prompt scoring/embeddings are not available with tensor-parallel or "
                         "disaggregated engines")
    return runner.model, int(caches[0].shape[1]), caches[0].dtype, int(runner.block_size)


def _groups(prompts: list[list[int]]) -> list[list[int]]:
    """Indices of prompts sharing one scratch cache: <= MAX_SCORE_TOKENS tokens (or one longer prompt)."""
    groups: list[list[int]] = []
    size = 0
    for i, p in enumerate(prompts):
        if not groups or size + len(p) > MAX_SCORE_TOKENS:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += len(p)
    return groups


SliceTokens = int | Callable[[], int]     # a forward's tokens, fixed or asked before each forward


def slice_budget(slice_tokens: SliceTokens) -> int:
    """The tokens of the next forward (at least 1)."""
    return max(1, slice_tokens() if callable(slice_tokens) else slice_tokens)


def _group_forwards(engine: Any, prompts: list[list[int]], slice_tokens: SliceTokens) -> Generator[int, None, list[Tensor]]:
    """Hidden states of prompts sharing one scratch cache, ``slice_tokens`` rows per forward; yields each
    forward's rows."""
    model, kvh, dtype, bs = _model_and_cache_shape(engine)
    nblocks = [math.ceil(len(p) / bs) for p in prompts]
    if hasattr(model, "allocate_caches"):   # a hybrid model: prompt i's recurrent state in slot i, from zero
        caches = model.allocate_caches(sum(nblocks), bs, dtype, len(prompts))
        model.restore_states(caches, [(-1, i) for i in range(len(prompts))])
    else:
        caches = allocate_kv_caches(engine.model_config, sum(nblocks), bs, dtype, num_kv_heads=kvh)
    starts = [sum(nblocks[:i]) for i in range(len(prompts))]
    tables = [list(range(s, s + n)) for s, n in zip(starts, nblocks, strict=True)]
    done = [0] * len(prompts)
    parts: list[list[Tensor]] = [[] for _ in prompts]
    while any(d < len(p) for d, p in zip(done, prompts, strict=True)):    # no torch mode held across a yield
        budget, rows = slice_budget(slice_tokens), []
        for i, p in enumerate(prompts):
            n = min(len(p) - done[i], budget)
            if n > 0:
                rows.append((i, done[i], n))
                budget -= n
            if budget == 0:
                break
        hidden, qsl = _forward(model, caches, [(prompts[i], tables[i], s, n) for i, s, n in rows], bs,
                               [i for i, _, _ in rows])
        for k, (i, _, n) in enumerate(rows):
            parts[i].append(hidden[qsl[k]:qsl[k + 1]])
            done[i] += n
        yield sum(n for _, _, n in rows)
    return [torch.cat(ps) if len(ps) > 1 else ps[0] for ps in parts]


@torch.inference_mode()
def _forward(model: Any, caches: list[Any], rows: list[tuple[list[int], list[int], int, int]],
             bs: int, state_slots: list[int] | None = None) -> tuple[Tensor, list[int]]:
    """One forward of (prompt, block table, first position, count) rows on the scratch caches (a hybrid
    model's rows read and update their prompt's state slot, ``state_slots``)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl = [0]
    for p, table, s, n in rows:
        ids.extend(p[s:s + n])
        positions.extend(range(s, s + n))
        slots.extend(table[i // bs] * bs + i % bs for i in range(s, s + n))
        qsl.append(qsl[-1] + n)
    meta = AttentionMetadata(query_start_loc=qsl, seq_lens=[s + n for _, _, s, n in rows],
                             block_tables=[t for _, t, _, _ in rows],
                             slot_mapping=torch.tensor(slots, dtype=torch.long), block_size=bs,
                             kernel_from=[len(p) - 1 for p, _, _, _ in rows], workspace={},
                             state_slots=state_slots)
    hidden = model(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long), meta, caches)
    return hidden, qsl


def hidden_states_job(engine: Any, prompts: list[list[int]],
                      slice_tokens: SliceTokens = SLICE_TOKENS) -> Generator[int, None, list[Tensor]]:
    """Final (normed) hidden states ``[len(p), H]`` of each prompt; yields each forward's tokens."""
    _model_and_cache_shape(engine)            # refuse at once where there is no local model
    out: list[Tensor | None] = [None] * len(prompts)
    for group in _groups(prompts):
        hidden = yield from _group_forwards(engine, [prompts[i] for i in group], slice_tokens)
        for i, h in zip(group, hidden, strict=True):
            out[i] = h
    return [h for h in out if h is not None]


@dataclass
class PromptScores:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]     # None at position 0 (nothing predicts the first token)


def score_job(engine: Any, prompts: list[list[int]], k: int,
              slice_tokens: SliceTokens = SLICE_TOKENS) -> Generator[int, None, list[PromptScores]]:
    """Raw logprob, rank and top ``k`` of every prompt token given the tokens before it."""
    hidden = yield from hidden_states_job(engine, prompts, slice_tokens)
    return [PromptScores(p, _token_logprobs(engine.runner.model, p, h, k)) for p, h in zip(prompts, hidden, strict=True)]


@torch.inference_mode()
def _token_logprobs(model: Any, p: list[int], h: Tensor, k: int) -> list[TokenLogprobs | None]:
    lps: list[TokenLogprobs | None] = [None]
    for s in range(0, len(p) - 1, _LOGITS_CHUNK):
        e = min(s + _LOGITS_CHUNK, len(p) - 1)
        logits = model.compute_logits(h[s:e])
        lps.extend(token_logprobs(logits, torch.tensor(p[s + 1:e + 1], dtype=torch.long), [k] * (e - s)))
    return lps


def run_now(job: Generator[Any, None, Any]) -> Any:
    """Run a job to its end in this thread; its result."""
    while True:
        try:
            next(job)
        except StopIteration as done:
            return done.value


def forward_hidden(engine: Any, prompts: list[list[int]]) -> list[Tensor]:
    """``hidden_states_job`` at once (the caller owns the engine)."""
    return run_now(hidden_states_job(engine, prompts, MAX_SCORE_TOKENS))     # type: ignore[no-any-return]


def score_prompts(engine: Any, prompts: list[list[int]], k: int) -> list[PromptScores]:
    """``score_job`` at once (the caller owns the engine, e.g. bench/lm_eval_check.py)."""
    return run_now(score_job(engine, prompts, k, MAX_SCORE_TOKENS))     # type: ignore[no-any-return]
