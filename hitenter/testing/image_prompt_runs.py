"""Run a text model over a prompt holding one image, as the vision prompt tests compare with llama.cpp's mtmd:
the image's rows (marked by negative token ids) take the encoder's embeddings in place of token embeddings."""

from __future__ import annotations

import numpy as np
import torch

from hitenter.models.attention import AttentionMetadata, allocate_kv_caches

BLOCK = 16


def image_span(tokens: np.ndarray) -> tuple[int, int]:
    """[start, end) of the image's rows: the one run of negative ids (AssertionError if not one run)."""
    rows = np.flatnonzero(tokens < 0)
    assert len(rows) and np.array_equal(rows, np.arange(rows[0], rows[-1] + 1))
    return int(rows[0]), int(rows[-1]) + 1


@torch.inference_mode()
def image_prompt_logits(model: torch.nn.Module, tokens: np.ndarray, embd: torch.Tensor,
                        positions: torch.Tensor | None = None, bidirectional: bool = False,
                        cuts: tuple[int, ...] = ()) -> torch.Tensor:
    """Logits of every row of the prompt, run in steps cut at `cuts` (a cut never splits the image; a step
    holding the image attends within it both ways when `bidirectional`). positions: per row (1-D, or [T, 4]
    for multi-axis RoPE); default 0..T-1."""
    n = len(tokens)
    s, e = image_span(tokens)
    pos = torch.arange(n) if positions is None else positions
    ids = torch.tensor(np.where(tokens < 0, 0, tokens))
    blocks = -(-n // BLOCK)
    caches = allocate_kv_caches(model.config, blocks, BLOCK)
    out = []
    for a, b in zip((0, *cuts), (*cuts, n), strict=True):
        inside = [r for r in range(a, b) if s <= r < e]
        embeds = None
        if inside:
            assert inside == list(range(s, e)), "a step must hold the whole image"
            embeds = (torch.arange(s - a, e - a), embd)
        spans = [[(s, e)]] if bidirectional and inside else None
        meta = AttentionMetadata([0, b - a], [b], [list(range(blocks))], torch.arange(a, b), BLOCK,
                                 bidirectional=spans)
        out.append(model.compute_logits(model(ids[a:b], pos[a:b], meta, caches, embeds=embeds)))
    return torch.cat(out)
