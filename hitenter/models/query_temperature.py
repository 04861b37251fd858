"""The position-dependent query temperature of Ministral 3 and Llama 4 (llama.cpp's attention temperature
tuning, `llm_graph_input_attn_temp`): a layer's rotated queries are multiplied by

    t(pos) = 1 + scale * ln(floor((pos + offset) / floor_scale) + 1)

(1 for every position below floor_scale - offset: llama.cpp's floor is the YaRN original context, 16384 on
Ministral 3, 8192 on Llama 4). Computed in float64 and rounded to float32, as llama.cpp fills its input."""

from __future__ import annotations

import torch

from hitenter.models.attention import AttentionMetadata


def row_positions(attn: AttentionMetadata, rows: int) -> torch.Tensor:
    """The position of each of the step's `rows` rows (sequence i's new rows end at seq_lens[i] - 1);
    padding rows past the step's tokens get position 0."""
    pos = torch.zeros(rows, dtype=torch.float64)
    qsl = attn.query_start_loc
    for i, seq_len in enumerate(attn.seq_lens):
        a, b = qsl[i], qsl[i + 1]
        pos[a:b] = torch.arange(seq_len - (b - a), seq_len, dtype=torch.float64)
    return pos


def temperature(positions: torch.Tensor, scale: float, floor_scale: int, offset: float) -> torch.Tensor:
    """t(pos) per position (module docstring), float32 `[T, 1, 1]` to multiply queries `[T, heads, D]`."""
    t = torch.log(torch.floor((positions.double() + offset) / floor_scale) + 1.0) * scale + 1.0
    return t.float().view(-1, 1, 1)
