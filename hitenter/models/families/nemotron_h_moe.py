"""Nemotron-H MoE (general.architecture "nemotron_h_moe", Nemotron 3 Nano; llama.cpp builds nemotron-h.cpp's
graph): Nemotron-H (families/nemotron_h.py) whose FFN layers are a mixture of ungated squared-ReLU experts
(ffn_up_exps, ffn_down_exps, expert_feed_forward_length wide) plus a shared ungated squared-ReLU expert
(ffn_up_shexp, ffn_down_shexp, expert_shared_feed_forward_length wide), added:

    probs = sigmoid(ffn_gate_inp . y);  chosen = top-k of probs + exp_probs_b.bias
    w = probs[chosen] (/ their sum where expert_weights_norm) (x expert_weights_scale where not 0 or 1)
    ffn(y) = sum_k w_k down_k(relu(up_k y)^2) + down_sh(relu(up_sh y)^2)

Refused at load: expert groups (expert_group_count > 1), the latent projections (ffn_latent_down / _up),
per-layer expert counts that differ.
"""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Meta, largest
from hitenter.models.families.lfm2 import experts_shapes
from hitenter.models.families.nemotron_h import NemotronH


class NemotronHMoE(NemotronH):
    arch = "nemotron_h_moe"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        out = super().fields(meta, cfg, names)
        if int(meta.get("expert_group_count", 0) or 0) > 1:
            raise ModelLoadError(f"{self.arch}: expert groups (expert_group_count > 1) are not supported")
        if any(".ffn_latent_" in name for name in names):
            raise ModelLoadError(f"{self.arch}: the latent expert projections (ffn_latent_down / "
                                 "ffn_latent_up) are not supported")
        used = meta.require("expert_used_count")
        if isinstance(used, list) and len({int(u) for u in used if int(u)}) > 1:
            raise ModelLoadError(f"{self.arch}: per-layer expert_used_count values that differ are not supported")
        shared = int(meta.require("expert_shared_feed_forward_length"))
        out.update(num_experts=int(meta.require("expert_count")), num_experts_used=largest(used),
                   expert_intermediate_size=largest(meta.require("expert_feed_forward_length")),
                   expert_gating="sigmoid", expert_norm_topk=bool(meta.get("expert_weights_norm", False)),
                   expert_weights_scale=float(meta.get("expert_weights_scale", 0.0)), intermediate_size=shared)
        return out

    def ffn_shapes(self, cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
        h, f = cfg.hidden_size, cfg.intermediate_size
        return {**experts_shapes(cfg, p, gated=False), p + "exp_probs_b.bias": (cfg.num_experts,),
                p + "ffn_up_shexp.weight": (f, h), p + "ffn_down_shexp.weight": (h, f)}


FAMILY = NemotronHMoE()
