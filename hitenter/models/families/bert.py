"""BERT encoders (general.architecture "bert": BGE, all-MiniLM, bge-reranker; models/encoder.py runs them):
bidirectional, absolute position embeddings (`position_embd`) plus token type row 0 (llama.cpp feeds every
token as "sentence A"), a LayerNorm over the embeddings (`token_embd_norm`), post-residual LayerNorms
(`attn_output_norm`, `layer_output_norm`; eps `attention.layer_norm_epsilon`), q/k/v and output with biases,
an ungated GELU FFN with biases (tanh GELU, as ggml's), no final norm. Pooling by `pooling_type`; a
reranker's classifier head (`cls`, `cls.output`) is models/pooling.py's."""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.models.families.base import Family, Meta

ENCODER_NORM_KEY = "attention.layer_norm_epsilon"


class Bert(Family):
    arch = "bert"

    def config(self, values: dict[str, Any], names: set[str] | None) -> ModelConfig:
        """As Family.config, the LayerNorm eps read where the common fields read the RMS one."""
        values = dict(values)
        eps = values.get(f"{self.arch}.{ENCODER_NORM_KEY}")
        if eps is not None:
            values.setdefault(f"{self.arch}.attention.layer_norm_rms_epsilon", eps)
        return super().config(values, names)

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"causal": False, "norm_type": "layer", "norm_placement": "post_residual",
                "activation": "gelu_tanh", "use_rope": False}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h = cfg.hidden_size
        shapes = {"token_embd.weight": (cfg.vocab_size, h), "position_embd.weight": (cfg.context_length, h),
                  **encoder_common_shapes(cfg, names)}
        for i in range(cfg.num_layers):
            p, q, kv = f"blk.{i}.", cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
            shapes.update({p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h)})
            shapes.update(_optional(names, {p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)}))
        return shapes


def encoder_common_shapes(cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
    """What bert and nomic-bert share besides Q/K/V: token types, the embedding LayerNorm, the output
    projection, the two post-residual LayerNorms and the FFN (gated where the file has ffn_gate), biases
    where the file has them."""
    h, f, q = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd_norm.weight": (h,), "token_embd_norm.bias": (h,)}
    if "token_types.weight" in names:
        shapes["token_types.weight"] = (-1, h)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        shapes.update({p + "attn_output.weight": (h, q), p + "ffn_up.weight": (f, h), p + "ffn_down.weight": (h, f)})
        for norm in ("attn_output_norm", "layer_output_norm"):
            shapes.update({p + norm + ".weight": (h,), p + norm + ".bias": (h,)})
        if p + "ffn_gate.weight" in names:
            shapes[p + "ffn_gate.weight"] = (f, h)
        shapes.update(_optional(names, {p + "attn_output.bias": (h,), p + "ffn_up.bias": (f,),
                                        p + "ffn_down.bias": (h,)}))
    return shapes


def _optional(names: set[str], shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {n: s for n, s in shapes.items() if n in names}


FAMILY = Bert()
