"""Multi-axis RoPE (M-RoPE) of the Qwen-VL text models and the positions of an image's rows, as llama.cpp
computes them (ggml-cpu ggml_mrope_cache_init, mtmd's M-RoPE decoder positions).

A token has four position axes (t, h, w, e). Rotated pair k (NEOX layout: dims k and k + rope_dim/2) turns by
angle pos[axis(k)] x base^(-2k / rope_dim), where axis(k) comes from rope.dimension_sections (s_t, s_h,
s_w, s_e) with sector = k mod sum(sections):
- MROPE (qwen2vl): consecutive sections: t for sector < s_t, h below s_t + s_h, w below s_t + s_h + s_w,
  else e;
- IMROPE (qwen3vl): interleaved: h where sector % 3 == 1 and sector < 3 s_h, w where sector % 3 == 2 and
  sector < 3 s_w, t where sector % 3 == 0 and sector < 3 s_t, else e.

Positions (mtmd_helper_eval_chunk_single, llm_graph_input_pos): a text token at p is (p, p, p, 0); the
image of a rows x cols token grid placed at p0 puts its token (r, c) (row-major) at (p0, p0 + r, p0 + c, 0),
and the text after it continues at p0 + max(rows, cols).

Contract: MRope.table(positions [T] (text) or [T, 4]) -> cos, sin [T, 1, rope_dim]; a text row's values are
the same bits in either form. image_positions / text_positions / after_image lay out a prompt;
sequence_positions(start, stop, images) gives rows start..stop of a sequence holding images (each
(first row, rows, cols)) at once, for any cut of a prompt into steps and for the generated rows after it.
"""

from __future__ import annotations

import torch

from hitenter.errors import ModelLoadError
from hitenter.models.layers import Rope

AXES = 4


def pair_axes(sections: tuple[int, ...], pairs: int, interleaved: bool) -> torch.Tensor:
    """The position axis (0 t, 1 h, 2 w, 3 e) of each rotated pair: [pairs] long."""
    s = (tuple(sections) + (0,) * AXES)[:AXES]
    total = sum(s)
    if total <= 0:
        raise ModelLoadError(f"rope.dimension_sections {list(sections)} has no dimensions")
    out = []
    for k in range(pairs):
        sector = k % total
        if interleaved:
            axis = next((a for a, m in ((1, 1), (2, 2), (0, 0)) if sector % 3 == m and sector < 3 * s[a]), 3)
        else:
            axis = 0 if sector < s[0] else 1 if sector < s[0] + s[1] else 2 if sector < s[0] + s[1] + s[2] else 3
        out.append(axis)
    return torch.tensor(out, dtype=torch.long)


class MRope(Rope):
    """Rope whose pairs turn by the position of their own axis (see the module docstring)."""

    def __init__(self, head_dim: int, theta: float, max_pos: int, rope_dim: int, sections: tuple[int, ...],
                 interleaved: bool) -> None:
        super().__init__(head_dim, theta, max_pos, rope_dim)
        self.axes = pair_axes(sections, self.rope_dim // 2, interleaved)
        self.text_axes = self.axes < 3   # the pairs a text token turns (its e position is 0)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.ndim == 1:
            if bool(self.text_axes.all()):   # every pair on t / h / w: plain RoPE at p
                return super().table(positions, dtype)
            positions = text_positions_of(positions)
        if positions.ndim != 2 or positions.shape[1] != AXES:
            raise ValueError(f"M-RoPE positions must be [T] or [T, {AXES}], got {tuple(positions.shape)}")
        freqs = positions.long().index_select(1, self.axes).float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().unsqueeze(1).to(dtype), emb.sin().unsqueeze(1).to(dtype)


def text_positions_of(p: torch.Tensor) -> torch.Tensor:
    """[T] text positions -> [T, 4]: (p, p, p, 0)."""
    p = p.long()
    return torch.stack([p, p, p, torch.zeros_like(p)], dim=1)


def text_positions(start: int, n: int) -> torch.Tensor:
    """n text tokens from position `start`: [n, 4]."""
    return text_positions_of(torch.arange(start, start + n))


def image_positions(start: int, rows: int, cols: int) -> torch.Tensor:
    """The rows x cols image tokens (row-major) placed at `start`: [rows * cols, 4]."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r, c = r.reshape(-1), c.reshape(-1)
    return torch.stack([torch.full_like(r, start), start + r, start + c, torch.zeros_like(r)], dim=1)


def after_image(start: int, rows: int, cols: int) -> int:
    """The position of the first token after an image placed at `start` (mtmd_image_tokens_get_n_pos)."""
    return start + max(rows, cols)


def sequence_positions(start: int, stop: int, images: list[tuple[int, int, int]]) -> torch.Tensor:
    """M-RoPE positions [stop - start, 4] of a sequence's rows start..stop-1, the sequence holding `images`
    as (first row, rows, cols) in row order: text rows count on from the previous row's t (+1), an image
    takes its grid's positions at the t its first row would have had, and the text after it resumes at
    that t + max(rows, cols)."""
    out = text_positions(start, stop - start)
    shift = 0   # rows minus positions taken by the images before the current row
    for first, rows, cols in sorted(images):
        n = rows * cols
        if first >= stop:
            break
        t0 = first - shift
        lo, hi = max(first, start), min(first + n, stop)
        if lo < hi:
            out[lo - start:hi - start] = image_positions(t0, rows, cols)[lo - first:hi - first]
        shift += n - (after_image(t0, rows, cols) - t0)
        tail = max(first + n, start)
        if tail < stop:
            out[tail - start:] = text_positions(tail - shift, stop - tail)
    return out
