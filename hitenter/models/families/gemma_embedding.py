"""EmbeddingGemma (general.architecture "gemma-embedding"): Gemma 3's layers (sandwich RMS norms, QK-norm per
head, GeGLU, sqrt(hidden)-scaled embeddings, 5 local layers to 1 global) run bidirectionally: a local
layer's window is symmetric (keys within sliding_window / 2 on either side, llama.cpp's
LLAMA_SWA_TYPE_SYMMETRIC), local layers rotate with `rope.freq_base_swa` (10000 where absent), the attention
scale is 1 / sqrt(head_dim), the final `output_norm` ends the encoder. Pooling (mean) and the optional
sentence-transformers Dense heads `dense_2` / `dense_3` are models/pooling.py's."""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.models.families.base import Meta, standard_shapes
from hitenter.models.families.gemma3 import LOCAL_ROPE_THETA, Gemma3


class GemmaEmbedding(Gemma3):
    arch = "gemma-embedding"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        fields = super().fields(meta, cfg, names)
        fields.update(causal=False, query_pre_attn_scalar=float(cfg["head_dim"]), final_logit_softcap=0.0,
                      rope_local_theta=float(meta.get("rope.freq_base_swa", LOCAL_ROPE_THETA)))
        return fields

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        return {n: s for n, s in standard_shapes(cfg, names).items() if n != "output.weight"}


FAMILY = GemmaEmbedding()
