"""gpt-oss (general.architecture "gpt-oss"): a mixture of experts with attention sinks, the family added
last, as a demonstration that a family is one file.

What differs (llama.cpp's LLM_ARCH_OPENAI_MOE): Q/K/V and the output projection have biases; every layer
has `attn_sinks` (one logit per head joining each softmax's denominator, models/sink_attention.py);
sliding window (`attention.sliding_window`) on every other layer from layer 0 (pattern 2), one RoPE for
both kinds, YaRN-scaled (`rope.scaling.type` yarn, decoder.rope_factors); the FFN's input norm is stored
as `post_attention_norm` (there is no `ffn_norm` and no norm after the FFN); experts with biases
(`ffn_{gate,up,down}_exps.bias`) and a router bias (`ffn_gate_inp.bias`), top-k by the router's logits
with the weights a softmax over the chosen k (no renormalisation), and llama.cpp's swiglu_oai
activation: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1). NEOX RoPE, not permuted.
"""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.models.families.base import Family, Meta, experts_fields, standard_shapes


class GptOss(Family):
    arch = "gpt-oss"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"sliding_window": int(meta.get("attention.sliding_window", 128)), "sliding_window_pattern": 2,
                "activation": "swiglu_oai", "expert_gating": "softmax_weight", "expert_norm_topk": False,
                **experts_fields(meta, cfg["intermediate_size"])}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        shapes = standard_shapes(cfg, names)
        h, e, ef = cfg.hidden_size, cfg.num_experts, cfg.expert_intermediate_size
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            shapes[p + "post_attention_norm.weight"] = shapes.pop(p + "ffn_norm.weight")
            shapes.update({p + "attn_output.bias": (h,), p + "attn_sinks.weight": (cfg.num_heads,),
                           p + "ffn_gate_inp.bias": (e,), p + "ffn_gate_exps.bias": (e, ef),
                           p + "ffn_up_exps.bias": (e, ef), p + "ffn_down_exps.bias": (e, h)})
        return shapes

    def prepare(self, w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
        for i in range(cfg.num_layers):   # the FFN's input norm, stored under the post-attention name
            w[f"blk.{i}.ffn_norm.weight"] = w.pop(f"blk.{i}.post_attention_norm.weight")
        return w


FAMILY = GptOss()
