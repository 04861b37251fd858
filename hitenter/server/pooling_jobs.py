"""Embedding and reranking work on the engine's own thread (engine_jobs.py runs one slice per engine step):
each input's vector by the model's own pooling (models/pooling.py).

- An encoder (models/encoder.py) keeps no KV: inputs are sorted by length and packed without padding into
  forwards of at most ``slice_tokens`` tokens (an input longer than that alone), so equal lengths share one
  attention GEMM; a forward per slice, never splitting an input (its attention sees all of it).
  ``slice_tokens`` is a number or a callable asked before each forward (the pooling share's slice size,
  hitenter/engine/cpu_share.py).
- A decoder (Qwen3-Embedding, Qwen3-Reranker, any chat model) runs prompt_logprobs' chunked forwards on a
  scratch cache, then its pooler over each input's rows.

``pool_job(engine, prompts, slice_tokens, normalize)`` yields each forward's token count and returns one list of
floats per prompt, in order: the pooled vector (L2-normalized when ``normalize``), or a reranker's scores.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch

from hitenter.models.encoder import EncoderModel
from hitenter.models.pooling import effective_pooling, l2_normalize
from hitenter.server.prompt_logprobs import SliceTokens, hidden_states_job, slice_budget


def _model(engine: Any) -> Any:
    model = getattr(getattr(engine, "runner", None), "model", None)
    if model is None or not hasattr(model, "pooler"):
        raise ValueError("input: embeddings are not available with tensor-parallel or disaggregated engines")
    if effective_pooling(model.config) == "none":
        raise ValueError("model: this model's pooling type is none (one vector per token), which gives no "
                         "embedding per input; use a model with mean, cls or last pooling")
    return model


def next_batch(order: list[int], lengths: list[int], start: int, slice_tokens: int) -> list[int]:
    """The inputs of the next forward: ``order[start:]``'s first ones within `slice_tokens` tokens (one at least)."""
    batch, size = [order[start]], lengths[order[start]]
    for i in order[start + 1:]:
        if size + lengths[i] > slice_tokens:
            break
        batch.append(i)
        size += lengths[i]
    return batch


def pool_job(engine: Any, prompts: list[list[int]], slice_tokens: SliceTokens,
             normalize: bool) -> Generator[int, None, list[list[float]]]:
    """The pooled vector (or reranker scores) of each prompt; yields each forward's tokens."""
    model = _model(engine)
    out: list[torch.Tensor | None] = [None] * len(prompts)
    if isinstance(model, EncoderModel):
        lengths = [len(p) for p in prompts]
        order, done = sorted(range(len(prompts)), key=lambda k: lengths[k]), 0
        while done < len(order):
            batch = next_batch(order, lengths, done, slice_budget(slice_tokens))
            for i, v in zip(batch, model.embed_sequences([prompts[i] for i in batch]), strict=True):
                out[i] = v
            done += len(batch)
            yield sum(lengths[i] for i in batch)
    else:
        hidden = yield from hidden_states_job(engine, prompts, slice_tokens)
        with torch.inference_mode():
            for i, h in enumerate(hidden):
                out[i] = model.pooler(h, [h.shape[0]])[0]
    vecs = torch.stack([v for v in out if v is not None])
    return (l2_normalize(vecs) if normalize else vecs).tolist()
