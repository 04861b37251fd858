"""Qwen3 and Qwen3-Coder (general.architecture "qwen3"): Qwen2 without the Q/K/V biases and with QK-norm,
an RMSNorm over each query and key head before RoPE (`attn_q_norm` / `attn_k_norm`, [head_dim]); the head
size comes from `attention.key_length` (128 where hidden / heads is not)."""

from __future__ import annotations

from typing import Any

from hitenter.models.families.base import Family, Meta


class Qwen3(Family):
    arch = "qwen3"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"qk_norm": "head"}


FAMILY = Qwen3()
