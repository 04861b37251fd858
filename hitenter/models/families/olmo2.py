"""OLMo 2 (general.architecture "olmo2"): norms after each block only, x + post_norm(f(x)) with no norm
before attention or the FFN (`post_attention_norm`, `post_ffw_norm`), and QK-norm over the whole Q and K
projections (`attn_q_norm` [heads x head_dim], `attn_k_norm` [kv heads x head_dim]) before RoPE (NEOX, not
permuted)."""

from __future__ import annotations

from typing import Any

from hitenter.models.families.base import Family, Meta


class OLMo2(Family):
    arch = "olmo2"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"norm_placement": "post", "qk_norm": "full"}


FAMILY = OLMo2()
