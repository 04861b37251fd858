"""Llama 1/2/3.x, Mistral-style llama files and Mixtral (general.architecture "llama").

Differs from nothing: it is the baseline. convert_hf_to_gguf stores Q/K permuted for llama.cpp's
interleaved (NORM) RoPE. Llama 3.1+ files carry `rope_freqs.weight`, one factor per frequency computed
from rope_scaling (factor, low/high_freq_factor, original_max_position_embeddings): llama.cpp divides
each frequency by it, and so does decoder.Rope. Mixtral: `llama.expert_count` experts per layer
(`ffn_gate_inp`, `ffn_{gate,up,down}_exps`), softmax routing over all experts, top-k renormalised.
"""

from __future__ import annotations

from typing import Any

from hitenter.models.families.base import Family, Meta, experts_fields, linear_rope_factor


class Llama(Family):
    arch = "llama"
    permuted_qk = True

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        # Llama 3's scaling lives in rope_freqs.weight; a "llama3" type key, where a converter writes one,
        # says the same thing
        return {"rope_scaling_factor": linear_rope_factor(meta, ("llama3",)),
                **experts_fields(meta, cfg["intermediate_size"])}


FAMILY = Llama()
