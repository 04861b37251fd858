"""Qwen2-VL / Qwen2.5-VL text models (general.architecture "qwen2vl"): Qwen2 (Q/K/V biases, NEOX RoPE) with
multi-axis RoPE: rope.dimension_sections (t, h, w, e) in consecutive sections (llama.cpp
LLAMA_ROPE_TYPE_MROPE; models/mrope.py), so an image's rows turn by their row and column."""

from __future__ import annotations

from typing import Any

from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Meta
from hitenter.models.families.qwen2 import Qwen2


def rope_sections(meta: Meta) -> tuple[int, ...]:
    """rope.dimension_sections as 4 non-negative counts (llama.cpp reads the first 4)."""
    raw = [int(s) for s in meta.require("rope.dimension_sections")][:4]
    sections = tuple(raw + [0] * (4 - len(raw)))
    if min(sections) < 0 or sum(sections) <= 0:
        raise ModelLoadError(f"{meta.arch}: rope.dimension_sections {list(sections)} must be >= 0 and not all 0")
    return sections


class Qwen2VL(Qwen2):
    arch = "qwen2vl"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {**super().fields(meta, cfg, names), "rope_sections": rope_sections(meta)}


FAMILY = Qwen2VL()
