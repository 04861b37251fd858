"""Which path each row of a step takes through a model's layers (every family): the fused native
layers (hitenter/models/fused_decode.py) for generation rows, the torch layers (`forward_torch`, the
statement of the math) for the others.

A row's path depends only on its request's prompt length and its position (AttentionMetadata.kernel_rows),
never on the other rows, so batch invariance, chunk invariance and speculative identity hold. A whole
step: the prompt rows through every torch layer, then the generation rows through every fused layer in
one native call (`run_layers`); one layer at a time (the playground's trace): `layer_forward`, the same
bits per row.
"""

from __future__ import annotations

from typing import Any

import torch

from hitenter.models import decode_kernel, fused_decode
from hitenter.models.fused_decode import Tables


def gemm_only(meta: Any) -> tuple[torch.Tensor, Any]:
    """(flat indices of the step's rows that take the GEMM path, metadata for just those rows, all on the
    GEMM path): each sequence's first rows up to its prompt length - 1, seen as a step of their own, with
    its bidirectional (image) ranges."""
    rows: list[int] = []
    qsl, seq_lens, tables, local = [0], [], [], getattr(meta, "local_block_tables", None)
    ltables, spans, bidi = [], [], getattr(meta, "bidirectional", None)
    for i, seq_len in enumerate(meta.seq_lens):
        a, n = meta.query_start_loc[i], meta.query_start_loc[i + 1] - meta.query_start_loc[i]
        g = meta.gemm_rows(i, True)
        if g == 0:
            continue
        rows.extend(range(a, a + g))
        qsl.append(qsl[-1] + g)
        seq_lens.append(seq_len - (n - g))
        tables.append(meta.block_tables[i])
        spans.append(bidi[i] if bidi else [])
        if local is not None:
            ltables.append(local[i])
    idx = torch.tensor(rows, dtype=torch.long)
    sub = type(meta)(qsl, seq_lens, tables, meta.slot_mapping.index_select(0, idx), meta.block_size,
                     workspace=meta.workspace, bidirectional=spans if any(spans) else None)
    if local is not None:   # the sliding-window layers' own tables (kv_cache/window_group.py)
        sub.local_block_tables, sub.local_slot_mapping = ltables, meta.local_slot_mapping.index_select(0, idx)
    return idx, sub


def split_forward(model: Any, x: torch.Tensor, attn: Any, kv_caches: list[torch.Tensor],
                  fused: list[fused_decode.FusedLayer],
                  kr: decode_kernel.KernelRows, layer_ropes: list[tuple[Any, tuple[torch.Tensor, torch.Tensor]]],
                  tables: Tables) -> torch.Tensor:
    """A model's layers on a step with generation rows `kr`: the prompt rows through every torch layer
    (`forward_torch`, their K/V written), then the generation rows through every fused layer in one call.
    layer_ropes: each layer's (RoPE, its cos/sin table); tables: the step's tables for the C layers.
    The same bits per row as the per-layer split (`layer_forward`) that the playground's trace runs."""
    if kr.all_rows:
        return fused_decode.run_all_layers(model, x, attn, tables, kv_caches, fused, kr)
    out = torch.empty_like(x)
    rows, meta = gemm_only(attn)
    xg = x.index_select(0, rows)
    sub: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer, cache, (rope, cs) in zip(model.layers, kv_caches, layer_ropes, strict=True):
        if cs is not None and id(cs[0]) not in sub:
            sub[id(cs[0])] = (cs[0].index_select(0, rows), cs[1].index_select(0, rows))
        xg = layer.forward_torch(xg, rope, None if cs is None else sub[id(cs[0])], meta, cache, xg.shape[0])
    out.index_copy_(0, rows, xg)
    gen = fused_decode.run_all_layers(model, x.index_select(0, kr.rows), attn, tables, kv_caches, fused, kr)
    out.index_copy_(0, kr.rows, gen)
    return out


def run_layers(model: Any, x: torch.Tensor, attn: Any, kv_caches: list[torch.Tensor],
               layer_ropes: list[tuple[Any, tuple[torch.Tensor, torch.Tensor]]], tables: Tables, n: int) -> torch.Tensor:
    """Every layer of a model (every family) on the step's rows x `[T, H]` (T >= n: padding rows kept),
    before the final norm: `split_forward` when the step has generation rows and every layer runs fused,
    else each layer in turn. layer_ropes: each layer's (RoPE, cos/sin table); tables: the step's tables."""
    plain = not model.dense_gemms   # no padded GEMMs (TP shards of blocks too: distributed/fused.py)
    fused = fused_decode.all_fused(model, attn, kv_caches) if plain else None
    kr = attn.kernel_rows(global_cache(model, kv_caches).shape[2]) if fused is not None else None
    if kr is not None:   # generation rows: all layers in one native call, after the prompt rows' layers
        return split_forward(model, x, attn, kv_caches, fused, kr, layer_ropes, tables)
    for layer, cache, (rope, cos_sin) in zip(model.layers, kv_caches, layer_ropes, strict=True):
        x = layer(x, rope, cos_sin, attn, cache, n)
    return x


def global_cache(model: Any, kv_caches: list[torch.Tensor]) -> torch.Tensor:
    """A global (not sliding-window) layer's cache: the one the step's global block tables index
    (the local layers' caches may hold fewer blocks, kv_cache/window_group.py)."""
    return next((c for layer, c in zip(model.layers, kv_caches, strict=True)
                 if getattr(layer, "window", None) is None), kv_caches[0])


def layer_forward(layer: Any, x: torch.Tensor, rope: Any, cos_sin: tuple[torch.Tensor, torch.Tensor], attn: Any,
                  kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
    """One layer called on its own (the trace): generation rows fused, the others through `forward_torch`."""
    attn = attn.for_window(getattr(layer, "window", None))
    fused = fused_decode.fused_layer(layer, kv_cache) if attn.kernel_from is not None and attn.use_kernel is not False else None
    kr = attn.kernel_rows(kv_cache.shape[2]) if fused is not None else None
    if kr is None:
        return layer.forward_torch(x, rope, cos_sin, attn, kv_cache, n_real)
    if cos_sin is None:   # a layer without RoPE (the C layer skips it): any table of the right shape
        ones = x.new_ones(x.shape[0], 1, 2)
        cos_sin = (ones, ones)
    step = fused_decode.step_state(attn, kr, [cos_sin], kv_cache, fused)
    if kr.all_rows and n_real == x.shape[0]:
        return fused.run(x, step, kv_cache)
    # the torch layer first (it writes the prompt rows' K/V), then the generation rows natively (their
    # K/V and outputs replaced), so each row gets its own path's bits
    y = layer.forward_torch(x, rope, cos_sin, attn, kv_cache, n_real)
    y.index_copy_(0, kr.rows, fused.run(x.index_select(0, kr.rows), step, kv_cache))
    return y
