"""Qwen3-MoE (general.architecture "qwen3moe", e.g. Qwen3-30B-A3B): Qwen3's attention with a mixture of
experts in every layer: `expert_count` experts of `expert_feed_forward_length`, `expert_used_count` per
token, softmax router over all experts, the top-k weights renormalised (llama.cpp's build_moe_ffn with
norm_w), no shared expert."""

from __future__ import annotations

from typing import Any

from hitenter.models.families.base import Family, Meta, experts_fields


class Qwen3MoE(Family):
    arch = "qwen3moe"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"qk_norm": "head", **experts_fields(meta, cfg["intermediate_size"])}


FAMILY = Qwen3MoE()
