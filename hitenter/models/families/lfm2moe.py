"""LFM2-MoE (general.architecture "lfm2moe"; llama.cpp src/models/lfm2moe.cpp builds lfm2's graph): LFM2
(families/lfm2.py) whose layers from `leading_dense_block_count` on have a mixture of experts instead of
the dense FFN: router ffn_gate_inp, experts ffn_{gate,up,down}_exps (SwiGLU, expert_feed_forward_length
wide), routing by `expert_gating_func` (the converter writes 2, sigmoid), chosen on the sigmoid plus the
per-expert `exp_probs_b.bias`, weighted by the unbiased sigmoids renormalised over the chosen k (no
further scale: llama.cpp reads no expert_weights_scale for lfm2moe)."""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Meta, experts_fields
from hitenter.models.families.lfm2 import LFM2

GATINGS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}   # llama.cpp's llama_expert_gating_func_type


def expert_gating(meta: Meta) -> str:
    """The router's gating from `expert_gating_func` (ModelLoadError for a kind hitenter lacks)."""
    code = int(meta.require("expert_gating_func"))
    if code not in GATINGS:
        raise ModelLoadError(f"{meta.arch}: expert_gating_func {code} is not supported (1 softmax, 2 sigmoid, "
                             "3 softmax_weight are)")
    return GATINGS[code]


class LFM2MoE(LFM2):
    arch = "lfm2moe"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        out = super().fields(meta, cfg, names)
        out.update(experts_fields(meta, cfg["intermediate_size"]))
        out.update(expert_gating=expert_gating(meta), expert_norm_topk=True,
                   leading_dense_layers=int(meta.get("leading_dense_block_count", 0)))
        return out

    def dense_layers(self, cfg: ModelConfig) -> int:
        return cfg.leading_dense_layers


FAMILY = LFM2MoE()
