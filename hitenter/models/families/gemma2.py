"""Gemma 2 (general.architecture "gemma2"): Gemma's sandwich norms (x + post_norm(f(norm(x))), norms stored
as 1 + w by the converter), embeddings x sqrt(hidden), GeGLU, soft-capped attention scores
(`attn_logit_softcapping`, 50) and logits (`final_logit_softcapping`, 30), and a sliding window
(`attention.sliding_window`) on every other layer starting with layer 0 (llama.cpp's swa pattern 2).
The attention scale is 1/sqrt(head_dim), except the 27B (46 layers), which llama.cpp scales by
1/sqrt(hidden / heads) (HF's query_pre_attn_scalar 144)."""

from __future__ import annotations

import math
from typing import Any

from hitenter.models.families.base import Family, Meta


class Gemma2(Family):
    arch = "gemma2"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        hidden, heads = cfg["hidden_size"], cfg["num_heads"]
        scalar = hidden / heads if cfg["num_layers"] == 46 else cfg["head_dim"]
        return {"norm_placement": "sandwich", "activation": "gelu_tanh", "embedding_scale": math.sqrt(hidden),
                "attn_logit_softcap": float(meta.get("attn_logit_softcapping", 50.0)),
                "final_logit_softcap": float(meta.get("final_logit_softcapping", 30.0)),
                "sliding_window": int(meta.get("attention.sliding_window", 4096)), "sliding_window_pattern": 2,
                "query_pre_attn_scalar": float(scalar)}


FAMILY = Gemma2()
