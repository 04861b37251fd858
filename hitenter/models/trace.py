"""One traced forward of the engine's own model: everything the playground draws "inside the model".

``trace_forward(model, ids)`` runs the same modules the engine runs (``engine.runner.model``: its
embedding, each layer's norms and fused projections, its RoPE table, the final norm and the LM head,
same weights, same dtype) but on its own, with no KV cache, no scheduler and no paging: the engine's
state is never touched, so untraced requests are not slowed by it (beyond sharing the CPU).

Each layer runs its own ``forward`` (the engine's code path) on a private KV cache, so the hidden states
and logits are the engine's; the attention probabilities, which the engine's paged kernel never
materialises, are computed beside it explicitly in fp32 as ``softmax(Q K^T / sqrt(d) + causal mask)``. Agreement: tests/models/test_trace.py (the engine's logits,
and HF transformers' ``output_attentions`` / ``output_hidden_states`` in fp32 eager).

``images``: (start, rows [n, dim], bidirectional) per image of the prompt: ``rows`` (the vision encoder's
output, hitenter/engine/encoder_cache.py) take the place of the token embeddings at rows ``start ..
start + n`` as the engine's runner puts them (CausalLM ``embeds=``); a bidirectional image (Gemma 3) is
attended both ways among its own rows, in the layers' forward and in the drawn probabilities alike. Models
that place images by M-RoPE or add DeepStack features (Qwen-VL) are refused (ValueError).

``hidden[l]`` is the residual stream *before* layer ``l`` (``hidden[0]`` = the token embeddings,
``hidden[L]`` = after the last layer, before the final norm). HF's last ``hidden_states`` entry is the
final norm of ``hidden[L]``; ``Trace.final_normed`` holds that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Trace:
    token_ids: list[int]                  # prompt ids, then any generated ids
    num_prompt: int
    embeddings: torch.Tensor              # [T, dim] the embedding rows of the tokens
    hidden: torch.Tensor                  # [layers + 1, T, dim] residual stream before each layer / at the end
    attentions: torch.Tensor              # [layers, heads, T, T] softmax probabilities (query, key)
    angles: torch.Tensor                  # [T, head_dim / 2] rotary angle (radians) of each dimension pair
    inv_freq: torch.Tensor                # [head_dim / 2] radians per position of each pair
    final_normed: torch.Tensor            # [T, dim] the final norm of hidden[-1]
    logits: torch.Tensor                  # [T, vocab] fp32
    generated: list[int] = field(default_factory=list)


def traceable(model: object) -> bool:
    """True for the engine's transformer (decoder.CausalLM, single process); False e.g. for the trigram toy,
    for hybrid models (models/hybrid.py), whose recurrent layers have no attention to draw, and for models
    whose layers take other inputs (`traceable = False`: Gemma 4's per-layer inputs, models/gemma4.py)."""
    return all(hasattr(model, a) for a in ("embed", "layers", "norm", "rope", "compute_logits")) \
        and getattr(model, "tp", None) is None and not getattr(getattr(model, "config", None), "layer_types", ()) \
        and getattr(model, "traceable", True)


def _layer_rope(model: torch.nn.Module, layer: torch.nn.Module) -> torch.nn.Module | None:
    """The RoPE a layer uses: the local layers' own (Gemma 3), the global one, or none (SmolLM3's NoPE layers)."""
    return model.layer_rope(layer)


Image = tuple[int, torch.Tensor, bool]     # (first row, the encoder's rows [n, dim], bidirectional)


def _probs(layer: torch.nn.Module, rope: torch.nn.Module | None, x: torch.Tensor,
           cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
           spans: Sequence[tuple[int, int]] = ()) -> torch.Tensor:
    """One layer's attention probabilities [H, T, T] on the whole sequence, in fp32 (for drawing): the
    layer's own Q/K (its norms, QK-norm and RoPE), its scale, soft-cap and sliding window."""
    t = x.shape[0]
    q, k, _ = layer.qkv_heads(x, rope, cos_sin)
    q, k = q.float().transpose(0, 1), k.float().transpose(0, 1)            # [H, T, d], [Hkv, T, d]
    k = k.repeat_interleave(layer.num_heads // layer.num_kv_heads, 0)      # GQA: a K head serves a group
    scores = q @ k.transpose(1, 2) * layer.scale
    if layer.softcap:
        scores = torch.tanh(scores / layer.softcap) * layer.softcap
    i = torch.arange(t)
    mask = i[None, :] > i[:, None]                                          # causal: no look ahead
    for a, b in spans:                                                      # an image's rows see each other
        mask[a:b, a:b] = False
    window = getattr(layer, "window", None)
    if window is not None:                                                  # keys older than the window
        mask |= i[:, None] - i[None, :] >= window
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)


def _private_cache(model: torch.nn.Module, n: int, num_prompt: int, block_size: int = 16,
                   spans: Sequence[tuple[int, int]] = (), image_end: int = 0) -> tuple[list[torch.Tensor], object]:
    """A KV cache of its own for one n-token sequence, and the metadata the engine would build for it as
    one prefill (rows from the prompt's last on generation rows, every row for a prompt short enough to
    run fused: models/plan.prompt_paths), so the layers run exactly as there."""
    from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
    from hitenter.models.plan import prompt_paths

    blocks = -(-n // block_size)
    # the engine's cache element type (set by plan.apply_plan; kv_dtype.py), so the layers round K/V as there
    kv_dtype = getattr(model, "kv_cache_dtype", model.dtype)
    paths = prompt_paths(model, num_prompt)
    paths = (max(paths[0], image_end), paths[1])                            # image rows: the GEMM path, as the runner
    caches = allocate_kv_caches(model.config, blocks, block_size, kv_dtype, num_kv_heads=model.layers[0].num_kv_heads)
    meta = AttentionMetadata(query_start_loc=[0, n], seq_lens=[n], block_tables=[list(range(blocks))],
                             slot_mapping=torch.arange(n, dtype=torch.long), block_size=block_size,
                             kernel_from=[paths[0]], decode_from=[paths[1]], workspace={},
                             bidirectional=[list(spans)] if spans else None)
    return caches, meta


@torch.inference_mode()
def trace_forward(model: torch.nn.Module, token_ids: list[int], num_prompt: int | None = None,
                  images: Sequence[Image] = ()) -> Trace:
    """The traced forward of ``token_ids`` through ``model`` (see the module doc).

    The residual stream is the engine's own forward (each layer's ``forward`` on a private KV cache, the
    same row padding), so the logits are the engine's bit for bit in every weight format; the attention
    probabilities are computed beside it, in fp32, for drawing."""
    if not traceable(model):
        raise ValueError("trace: this model is not a traceable transformer (the trigram toy, or tensor-parallel)")
    if not token_ids:
        raise ValueError("trace: no tokens")
    n = len(token_ids)
    pad = getattr(model, "_pad", lambda t: t)
    ids, pos = pad(torch.tensor(token_ids, dtype=torch.long)), pad(torch.arange(n, dtype=torch.long))
    x = model.embed(ids)
    if model.embed_scale != 1.0:   # Gemma, Granite scale their embeddings
        x = x * model.embed_scale
    x, spans = _with_images(model, x, n, images)
    emb = x[:n].float().clone()
    tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    caches, meta = _private_cache(model, n, n if num_prompt is None else num_prompt, spans=spans,
                                  image_end=max((s + len(r) for s, r, _ in images), default=0))
    hidden, attns = [emb], []
    for layer, cache in zip(model.layers, caches, strict=True):
        rope = _layer_rope(model, layer)
        if rope is not None and id(rope) not in tables:   # one table per RoPE, shared by its layers
            tables[id(rope)] = rope.table(pos, x.dtype)
        cos_sin = None if rope is None else tables[id(rope)]
        attns.append(_probs(layer, rope, x[:n], None if cos_sin is None else (cos_sin[0][:n], cos_sin[1][:n]), spans))
        x = layer(x, rope, cos_sin, meta, cache, n)
        hidden.append(x[:n].float().clone())
    normed = model.norm(x)[:n]
    logits = model.compute_logits(normed)
    inv_freq = model.rope.inv_freq.float()
    pos = pos[:n].float()
    return Trace(list(token_ids), n if num_prompt is None else num_prompt, emb,
                 torch.stack(hidden), torch.stack(attns), torch.outer(pos, inv_freq), inv_freq,
                 normed.float(), logits.float())


def _with_images(model: torch.nn.Module, x: torch.Tensor, n: int, images: Sequence[Image]
                 ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """x with each image's rows in place of its placeholder embeddings, and the bidirectional spans."""
    if not images:
        return x, []
    cfg = getattr(model, "config", None)
    if getattr(cfg, "rope_sections", None) or getattr(cfg, "deepstack_layers", None):
        raise ValueError("trace: images in a model that places them by M-RoPE or DeepStack (Qwen-VL) are not "
                         "traced; the image panel's attention map needs a Gemma 3 / Pixtral style model")
    for start, rows, _ in images:
        if start < 0 or start + len(rows) > n or rows.shape[-1] != x.shape[-1]:
            raise ValueError(f"trace: an image of {tuple(rows.shape)} rows at {start} does not fit {n} tokens "
                             f"of width {x.shape[-1]}")
        x = x.index_copy(0, torch.arange(start, start + len(rows)), rows.to(x.dtype))
    return x, [(s, s + len(r)) for s, r, bidir in images if bidir]


def trace_with_generation(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int = 0,
                          stop_ids: frozenset[int] = frozenset(), images: Sequence[Image] = ()) -> Trace:
    """Trace the prompt, then (optionally) continue greedily for up to ``max_new_tokens`` tokens and trace
    the whole sequence, so the generated tokens' attention to the prompt is drawn too; ``images`` as
    trace_forward's."""
    ids = list(prompt_ids)
    tr = trace_forward(model, ids, images=images)
    new: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(tr.logits[-1].argmax())
        new.append(nxt)
        if nxt in stop_ids:
            break
        tr = trace_forward(model, ids + new, num_prompt=len(ids), images=images)
    if new and len(tr.token_ids) < len(ids) + len(new):
        tr = trace_forward(model, ids + new, num_prompt=len(ids), images=images)
    tr.generated = new
    return tr


def logit_lens(model: torch.nn.Module, hidden: torch.Tensor, top: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """If we stopped at each layer: final norm + LM head on ``hidden`` [L + 1, dim] -> (probs, ids) [L + 1, top]."""
    with torch.inference_mode():
        logits = model.compute_logits(model.norm(hidden.to(model.dtype))).float()
        p = torch.softmax(logits, -1)
        return p.topk(top, dim=-1)


def embedding_table(model: torch.nn.Module) -> torch.Tensor:
    """The real token embedding table [V, dim] (fp32 view where the model keeps one)."""
    w = getattr(model.embed, "weight", None)
    if isinstance(w, torch.Tensor):
        return w
    return model.embed(torch.arange(model.config.vocab_size))


def nearest_tokens(model: torch.nn.Module, vec: torch.Tensor, top: int = 8,
                   cache: dict[int, torch.Tensor] | None = None) -> tuple[list[int], list[float]]:
    """Tokens whose embedding rows are nearest to ``vec`` by cosine similarity."""
    table = embedding_table(model)
    key = id(model)
    norms = cache.get(key) if cache is not None else None
    if norms is None:
        norms = table.float().norm(dim=-1).clamp_min(1e-12)
        if cache is not None:
            cache[key] = norms
    with torch.inference_mode():
        cos = (table.float() @ vec.float()) / (norms * vec.float().norm().clamp_min(1e-12))
        val, idx = cos.topk(top)
    return idx.tolist(), val.tolist()
