"""Phi-3 / Phi-3.5 / Phi-4-mini (general.architecture "phi3"): Llama with fused tensors: `attn_qkv`
([q + 2 kv, hidden], split at load into Q, K, V) and `ffn_up` holding gate then up ([2 ffn, hidden]);
NEOX RoPE (not permuted), partial where `rope.dimension_count` < head_dim (Phi-4-mini rotates 3/4).
LongRoPE files carry `rope_factors_short` / `rope_factors_long`: llama.cpp uses the short factors when
the context it serves (n_ctx) is within `rope.scaling.original_context_length`, the long ones beyond,
at every position, with cos/sin x `rope.scaling.attn_factor`; hitenter chooses the same way by the
max_model_len it serves (decoder.CausalLM). llama.cpp disables Phi-3's
sliding window (it warns and runs full attention), and so does hitenter, to give the same logits."""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.models.families.base import Family, Meta, standard_shapes


class Phi3(Family):
    arch = "phi3"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"rope_attn_factor": float(meta.get("rope.scaling.attn_factor", 1.0)),
                "rope_original_context": int(meta.get("rope.scaling.original_context_length", 0))}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        shapes = standard_shapes(cfg, names)
        h, f = cfg.hidden_size, cfg.intermediate_size
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            for name in ("attn_q", "attn_k", "attn_v", "ffn_gate"):
                del shapes[p + name + ".weight"]
            shapes[p + "attn_qkv.weight"] = (qkv, h)
            shapes[p + "ffn_up.weight"] = (2 * f, h)
        for kind in ("short", "long"):
            if f"rope_factors_{kind}.weight" in names:
                shapes[f"rope_factors_{kind}.weight"] = ((cfg.rope_dim or cfg.head_dim) // 2,)
        return shapes

    def prepare(self, w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
        q, kv, f = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            qkv, gate_up = w.pop(p + "attn_qkv.weight"), w.pop(p + "ffn_up.weight")
            w[p + "attn_q.weight"], w[p + "attn_k.weight"] = qkv.narrow(0, 0, q), qkv.narrow(0, q, kv)
            w[p + "attn_v.weight"] = qkv.narrow(0, q + kv, kv)
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = gate_up.narrow(0, 0, f), gate_up.narrow(0, f, f)
        return w


FAMILY = Phi3()
