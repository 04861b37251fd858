"""Qwen3-VL text models (general.architecture "qwen3vl"): Qwen3 (QK-norm) with interleaved multi-axis RoPE
(rope.dimension_sections, llama.cpp LLAMA_ROPE_TYPE_IMROPE; models/mrope.py) and DeepStack: an image's rows
carry n_deepstack_layers extra blocks, added after the first layers (models/deepstack.py)."""

from __future__ import annotations

from typing import Any

from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Meta
from hitenter.models.families.qwen2vl import rope_sections
from hitenter.models.families.qwen3 import Qwen3


def vl_fields(meta: Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    """The M-RoPE and DeepStack fields of a qwen3vl / qwen3vlmoe file."""
    n = int(meta.get("n_deepstack_layers", 0))
    if not 0 <= n <= cfg["num_layers"]:
        raise ModelLoadError(f"{meta.arch}: n_deepstack_layers {n} is outside 0..{cfg['num_layers']}")
    return {"rope_sections": rope_sections(meta), "rope_interleaved": True, "deepstack_layers": n}


class Qwen3VL(Qwen3):
    arch = "qwen3vl"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {**super().fields(meta, cfg, names), **vl_fields(meta, cfg)}


FAMILY = Qwen3VL()
