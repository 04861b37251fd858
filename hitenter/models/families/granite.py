"""Granite 3.x (general.architecture "granite"): Llama (Q/K permuted) with four multipliers, read as
llama.cpp reads them: embeddings x `embedding_scale`, each block's output x `residual_scale` before its
residual add, Q.K x `attention.scale` (instead of 1/sqrt(head_dim)), logits / `logit_scale`."""

from __future__ import annotations

from typing import Any

from hitenter.models.families.base import Family, Meta


class Granite(Family):
    arch = "granite"
    permuted_qk = True

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        logit_scale = float(meta.get("logit_scale", 1.0)) or 1.0
        return {"embedding_scale": float(meta.get("embedding_scale", 1.0)),
                "residual_scale": float(meta.get("residual_scale", 1.0)),
                "attention_scale": float(meta.get("attention.scale", 0.0)),
                "logit_scale": 1.0 / logit_scale}


FAMILY = Granite()
