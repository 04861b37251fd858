"""nomic-bert encoders (general.architecture "nomic-bert": nomic-embed-text v1 / v1.5): BERT's
post-residual LayerNorms and embedding LayerNorm (token type row 0 added, no position embeddings), a fused
`attn_qkv` without biases, RoPE NEOX over the whole head (`rope.freq_base`), and a SwiGLU FFN
(`ffn_gate`, `ffn_up`, `ffn_down`; llama.cpp reads no FFN biases for it)."""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.models.families.base import Meta
from hitenter.models.families.bert import Bert, encoder_common_shapes


class NomicBert(Bert):
    arch = "nomic-bert"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {**super().fields(meta, cfg, names), "activation": "silu", "use_rope": True}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h, qkv = cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        shapes = {"token_embd.weight": (cfg.vocab_size, h), **encoder_common_shapes(cfg, names | {
            f"blk.{i}.ffn_gate.weight" for i in range(cfg.num_layers)})}
        for n in [n for n in shapes if n.endswith((".ffn_up.bias", ".ffn_down.bias"))]:
            del shapes[n]          # llama.cpp's nomic-bert graph adds no FFN biases
        for i in range(cfg.num_layers):
            shapes[f"blk.{i}.attn_qkv.weight"] = (qkv, h)
        return shapes


FAMILY = NomicBert()
