"""Llama 4 text (general.architecture "llama4"), as llama.cpp's llama4 graph reads a file:

- Q/K in NORM (interleaved) order as in Llama's files (un-permuted at load), `rope_freqs` optional;
- three RoPE layers to one NoPE layer (layer i has no RoPE when (i + 1) % 4 == 0, llama.cpp's
  n_no_rope_layer_step); the RoPE layers attend in chunks of 8192 positions (LLAMA_SWA_TYPE_CHUNKED: a
  query sees its own chunk up to itself; models/chunked_attention.py) and RMS-normalise q and k without a
  weight after RoPE (Llama4TextL2Norm; not on the 128-expert model, as llama.cpp); the NoPE layers see
  every key and scale q by the temperature 1 + 0.1 ln(floor((pos + 1) / 8192) + 1)
  (models/query_temperature.py). llama.cpp hard-codes the chunk, the temperature and the pattern; a file
  whose attention.sliding_window_pattern array differs from the NoPE pattern, or with
  attention.sliding_window 0 (every layer RoPE, no chunking), is refused;
- the mixture of experts on every `interleave_moe_layer_step`-th layer (the others a dense SwiGLU of
  feed_forward_length): top-`expert_used_count` chosen on the router's logits, weights sigmoid(logit), each
  chosen expert's input multiplied by its weight (llama.cpp's weight_before_ffn), no renormalisation, plus a
  shared SwiGLU expert (`ffn_{gate,up,down}_shexp`, expert_feed_forward_length wide) added to the output.
"""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import (
    Family,
    Meta,
    experts_fields,
    largest,
    linear_rope_factor,
    standard_shapes,
)
from hitenter.models.families.olmo2 import swa_pattern

NO_ROPE_STEP = 4          # llama.cpp's n_no_rope_layer_step default
CHUNK = 8192              # llama.cpp: n_swa, n_attn_temp_floor_scale
TEMPERATURE = 0.1         # f_attn_temp_scale
TEMPERATURE_OFFSET = 1.0  # f_attn_temp_offset
NO_QK_NORM_EXPERTS = 128  # the 128-expert model (Maverick) runs without the QK norm


class Llama4(Family):
    arch = "llama4"
    permuted_qk = True

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        n = cfg["num_layers"]
        window = meta.get("attention.sliding_window")
        if window is not None and int(window) == 0:
            raise ModelLoadError(f"{self.arch}: attention.sliding_window 0 (every layer with RoPE, no chunked "
                                 "attention) is not supported")
        nope = tuple((i + 1) % NO_ROPE_STEP != 0 for i in range(n))
        if swa_pattern(meta, n, NO_ROPE_STEP) != nope:
            raise ModelLoadError(f"{self.arch}: attention.sliding_window_pattern differs from the RoPE layers "
                                 f"(every {NO_ROPE_STEP}th without); not supported")
        base_swa = meta.get("rope.freq_base_swa")
        if base_swa is not None and float(base_swa) != cfg["rope_theta"]:
            raise ModelLoadError(f"{self.arch}: rope.freq_base_swa {base_swa} differs from rope.freq_base; "
                                 "not supported")
        experts = experts_fields(meta, cfg["intermediate_size"])
        if not experts:
            raise ModelLoadError(f"{self.arch}: expert_count is 0 (llama.cpp refuses it too)")
        experts["expert_intermediate_size"] = largest(meta.require("expert_feed_forward_length"))
        return {"rope_scaling_factor": linear_rope_factor(meta, ("llama3",)),
                "attention_scale": float(meta.get("attention.scale", 0.0) or 0.0),
                "no_rope_interval": NO_ROPE_STEP, "attention_chunk": CHUNK,
                "qk_l2_norm": experts["num_experts"] != NO_QK_NORM_EXPERTS,
                "attn_temperature_scale": TEMPERATURE, "attn_temperature_floor": CHUNK,
                "attn_temperature_offset": TEMPERATURE_OFFSET, "attn_temperature_nope_only": True,
                "moe_layer_step": int(meta.require("interleave_moe_layer_step")),
                "expert_gating": "sigmoid", "expert_norm_topk": False, "expert_weights_on_input": True,
                **experts}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        shapes = standard_shapes(cfg, names)
        h, f, ef = cfg.hidden_size, cfg.intermediate_size, cfg.expert_intermediate_size
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            if cfg.layer_has_experts(i):
                shapes.update({p + "ffn_gate_shexp.weight": (ef, h), p + "ffn_up_shexp.weight": (ef, h),
                               p + "ffn_down_shexp.weight": (h, ef)})
            else:
                for name in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                    shapes.pop(p + name + ".weight")
                shapes.update({p + "ffn_gate.weight": (f, h), p + "ffn_up.weight": (f, h),
                               p + "ffn_down.weight": (h, f)})
        return shapes


FAMILY = Llama4()
