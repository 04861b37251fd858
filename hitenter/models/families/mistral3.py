"""Ministral 3 and Devstral Small 2 (general.architecture "mistral3"): Llama (Q/K permuted for NORM RoPE,
`rope_freqs` or YaRN scaling, optional experts) plus two things llama.cpp's mistral3 graph adds:

- YaRN's attention factor with `rope.scaling.yarn_log_multiplier` (the converter's mscale_all_dim):
  cos/sin x (1 + 0.1 ln f) / (1 + 0.1 m ln f), 1 on Ministral 3 (base.yarn_fields);
- the query temperature (`attention.temperature_scale`, the converter's llama_4_scaling_beta): after RoPE,
  q x (1 + beta ln(floor(pos / n) + 1)) with n the YaRN original context
  (`rope.scaling.original_context_length`, else `context_length`), every layer (models/query_temperature.py).

The attention scale is `attention.scale` where the file sets it, else 1/sqrt(head_dim). Attention-output and
FFN biases (which llama.cpp reads where present) are refused at load, as is a shared expert."""

from __future__ import annotations

from typing import Any

from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Family, Meta, experts_fields, linear_rope_factor


class Mistral3(Family):
    arch = "mistral3"
    permuted_qk = True

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        extra = sorted(n for n in names if n.endswith(("attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
                                                       "ffn_down.bias")) or "_shexp." in n)
        if extra:
            raise ModelLoadError(f"{self.arch}: tensor {extra[0]!r} (attention-output / FFN biases, shared "
                                 "experts) is not supported")
        out: dict[str, Any] = {"rope_scaling_factor": linear_rope_factor(meta, ("llama3",)),
                               "attention_scale": float(meta.get("attention.scale", 0.0) or 0.0),
                               **experts_fields(meta, cfg["intermediate_size"])}
        beta = float(meta.get("attention.temperature_scale", 0.0) or 0.0)
        if beta:
            floor = int(meta.get("rope.scaling.original_context_length", cfg["context_length"]) or 0)
            if floor <= 0:
                raise ModelLoadError(f"{self.arch}: a query temperature needs "
                                     "rope.scaling.original_context_length > 0")
            out.update(attn_temperature_scale=beta, attn_temperature_floor=floor)
        return out


FAMILY = Mistral3()
