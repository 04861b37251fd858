"""A prompt's KV computed on its own, into scratch blocks: what the disaggregated prefill worker
(hitenter/distributed/disagg_worker.py) ships and the side prefill (hitenter/engine/side_prefill.py) stages.

Rows take the path the engine's runner would give them (a short prompt's rows the fused layers:
models/plan.prompt_paths), and chunking does not change a row's bits, so the KV is bitwise what the
engine would have written for the same tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


@torch.inference_mode()
def prefill_kv(model: Any, ids: torch.Tensor, kv_caches: list[torch.Tensor], block_size: int, chunk: int,
               stop: Callable[[], bool] | None = None) -> bool:
    """The KV of `ids` (positions 0..n-1: a prompt of n + 1 tokens but its last) written into blocks
    0..ceil(n / block_size) - 1 of `kv_caches`, `chunk` tokens per forward, no LM head. `stop` is asked
    before each chunk; True ends the work early. Returns whether every chunk ran."""
    from hitenter.models.attention import AttentionMetadata
    from hitenter.models.plan import prompt_paths

    n = ids.numel()
    kernel_from, decode_from = prompt_paths(model, n + 1)
    table = list(range(-(-n // block_size)))
    for start in range(0, n, chunk):
        if stop is not None and stop():
            return False
        m = min(chunk, n - start)
        pos = torch.arange(start, start + m, dtype=torch.long)
        fused = kernel_from == 0
        meta = AttentionMetadata([0, m], [start + m], [table], pos.clone(), block_size,
                                 kernel_from=[0] if fused else None, decode_from=[decode_from] if fused else None)
        model(ids[start:start + m], pos, meta, kv_caches)
    return True


def load_staged(staged: dict[str, tuple[Any, int]], scheduled: Any, kv_caches: list[torch.Tensor]) -> None:
    """Copy the KV computed aside (``staged``: request id -> (per-layer KV ``[2, kv_heads, nb, block_size, w]``,
    indexable by layer; tokens)) of the requests in ``scheduled`` (a step's ScheduledRequests, just admitted)
    into their first blocks, and forget it."""
    for sr in scheduled:
        entry = staged.pop(sr.request.request_id, None)
        if entry is None:
            continue
        kv = entry[0]
        idx = torch.tensor(sr.block_ids[:kv[0].shape[2]], dtype=torch.long)
        for layer, cache in enumerate(kv_caches):
            cache.index_copy_(2, idx, kv[layer])
