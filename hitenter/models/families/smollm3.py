"""SmolLM3 (general.architecture "smollm3"): Llama (Q/K permuted) where every fourth layer runs without
RoPE (NoPE): layer i rotates only when (i + 1) % 4 != 0, llama.cpp's n_no_rope_layer_step."""

from __future__ import annotations

from typing import Any

from hitenter.models.families.base import Family, Meta

NO_ROPE_LAYER_STEP = 4


class SmolLM3(Family):
    arch = "smollm3"
    permuted_qk = True

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"no_rope_interval": int(meta.get("no_rope_layer_step", NO_ROPE_LAYER_STEP))}


FAMILY = SmolLM3()
