"""Qwen3-VL MoE text models (general.architecture "qwen3vlmoe", e.g. Qwen3-VL-30B-A3B): Qwen3-MoE with
Qwen3-VL's interleaved multi-axis RoPE and DeepStack (families/qwen3vl.py)."""

from __future__ import annotations

from typing import Any

from hitenter.models.families.base import Meta
from hitenter.models.families.qwen3moe import Qwen3MoE
from hitenter.models.families.qwen3vl import vl_fields


class Qwen3VLMoE(Qwen3MoE):
    arch = "qwen3vlmoe"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {**super().fields(meta, cfg, names), **vl_fields(meta, cfg)}


FAMILY = Qwen3VLMoE()
