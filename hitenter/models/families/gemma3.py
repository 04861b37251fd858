"""Gemma 3 text (general.architecture "gemma3"): Gemma 2's sandwich norms, sqrt(hidden) embeddings and
GeGLU, plus QK-norm per head, no attention soft-cap, 5 local layers (`attention.sliding_window`, RoPE base
10k) to 1 global (RoPE `rope.freq_base`, optional linear scaling); optional final soft-cap. llama.cpp
hard-codes the pattern (6) and the local base when the file does not say; the attention scale is
query_pre_attn_scalar ** -0.5 (head_dim unless the file says otherwise)."""

from __future__ import annotations

import math
from typing import Any

from hitenter.models.families.base import Family, Meta

SWA_PATTERN = 6            # llama.cpp (LLM_ARCH_GEMMA3): 5 local layers, then 1 global
LOCAL_ROPE_THETA = 10000.0


class Gemma3(Family):
    arch = "gemma3"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"norm_placement": "sandwich", "activation": "gelu_tanh", "qk_norm": "head",
                "embedding_scale": math.sqrt(cfg["hidden_size"]),
                "sliding_window": int(meta.require("attention.sliding_window")),
                "sliding_window_pattern": int(meta.get("attention.sliding_window_pattern", SWA_PATTERN)),
                "rope_local_theta": LOCAL_ROPE_THETA,
                "query_pre_attn_scalar": float(meta.get("attention.query_pre_attn_scalar", cfg["head_dim"])),
                "final_logit_softcap": float(meta.get("final_logit_softcapping", 0.0))}


FAMILY = Gemma3()
