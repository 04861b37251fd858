"""Gemma 4 text (general.architecture "gemma4"), dense (E2B / E4B with per-layer embeddings, 12B / 31B
without), as llama.cpp's gemma4 graph reads a file; run by models/gemma4.py.

What differs from Gemma 3 (sandwich norms, GeGLU, sqrt(hidden) embeddings, QK-norm per head, final soft-cap):
- the local layers are those `attention.sliding_window_pattern` (a per-layer array) marks; local and global
  layers have their own head size (`attention.key_length_swa` / `key_length`), KV heads (a per-layer
  `attention.head_count_kv` array), rotated dims (`rope.dimension_count_swa` / `rope.dimension_count`) and
  RoPE base (`rope.freq_base_swa`, default 10000 / `rope.freq_base`); the global layers divide their
  frequencies by `rope_freqs` (proportional partial RoPE: factors 1e30 leave the tail dims unrotated);
- norms are stored as they apply (no 1 + w); the attention scale is 1 (q and k are normed); V is RMS-normed
  without weight; a KV layer without `attn_v` uses its K projection as V (K = V, before K's norm and RoPE);
- the last `attention.shared_kv_layers` layers keep no KV: a local one reads the KV of the second-last layer
  before them, a global one the last's (llama.cpp's reuse; the file must have a local then a global layer
  there; ModelConfig.layer_kv_source); their FFN may be wider (a per-layer `feed_forward_length`);
- per-layer inputs (`embedding_length_per_layer_input` > 0): a token table `per_layer_token_embd`
  [vocab, layers x n] scaled by sqrt(n), plus `per_layer_model_proj` of the scaled embedding / sqrt(hidden),
  RMS-normed per layer (`per_layer_proj_norm`), the two summed and / sqrt(2); after each layer's FFN,
  x += post_norm(proj(gelu(inp_gate(x)) * that layer's slice));
- each layer's output times `layer_output_scale` where the file has one;
- the mixture-of-experts variant (26B-A4B: `ffn_gate_inp` in a layer): the dense GeGLU as a shared MLP,
  post_ffw_norm_1(mlp(ffn_norm(x))), plus post_ffw_norm_2(experts(pre_ffw_norm_2(x))) routed on
  rms(x) / sqrt(hidden) * `ffn_gate_inp.scale`: softmax over all experts, top-`expert_used_count`
  renormalised, GeGLU experts (`ffn_gate_exps` / `ffn_up_exps`, or merged `ffn_gate_up_exps`), each output
  times its expert's `ffn_down_exps.scale`; the sum goes through post_ffw_norm.
Rope scaling is refused at load."""

from __future__ import annotations

import math
from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Family, Meta, experts_fields, per_layer
from hitenter.models.families.qwen35 import split_gate_up

LOCAL_ROPE_THETA = 10000.0   # llama.cpp's rope_freq_base_train_swa default


class Gemma4(Family):
    arch = "gemma4"
    mapped_tables = ("per_layer_token_embd.weight",)

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        n = cfg["num_layers"]
        if meta.get("rope.scaling.type") not in (None, "none"):
            raise ModelLoadError(f"{self.arch}: RoPE scaling {meta.get('rope.scaling.type')!r} is not supported")
        pattern = meta.require("attention.sliding_window_pattern")
        if not isinstance(pattern, list | tuple) or len(pattern) != n:
            raise ModelLoadError(f"GGUF metadata {self.arch}.attention.sliding_window_pattern must be a per-layer "
                                 f"array of {n} entries")
        swa = tuple(bool(v) for v in pattern)
        shared = int(meta.get("attention.shared_kv_layers", 0) or 0)
        first_shared = n - shared
        if shared and not (first_shared >= 2 and swa[first_shared - 2] and not swa[first_shared - 1]):
            # llama.cpp's reuse: local layers read layer first_shared - 2, global ones first_shared - 1
            raise ModelLoadError(f"{self.arch}: {shared} KV-shared layers need a local then a global layer "
                                 "right before them")
        head_swa = int(meta.require("attention.key_length_swa"))
        if int(meta.get("attention.value_length_swa", head_swa)) != head_swa or int(
                meta.get("attention.value_length", cfg["head_dim"])) != cfg["head_dim"]:
            raise ModelLoadError(f"{self.arch}: key and value head sizes must be equal (llama.cpp requires it)")
        rope_full = cfg["rope_dim"] or cfg["head_dim"]
        return {"norm_placement": "sandwich", "activation": "gelu_tanh", "qk_norm": "head",
                "embedding_scale": math.sqrt(cfg["hidden_size"]), "attention_scale": 1.0,
                "sliding_window": int(meta.require("attention.sliding_window")), "swa_layers": swa,
                "rope_local_theta": float(meta.get("rope.freq_base_swa", LOCAL_ROPE_THETA)),
                "head_dim_swa": head_swa, "rope_dim_swa": int(meta.get("rope.dimension_count_swa", rope_full)),
                "kv_heads_per_layer": tuple(per_layer(meta, "attention.head_count_kv", n, cfg["num_heads"])),
                "ffn_per_layer": tuple(per_layer(meta, "feed_forward_length", n)),
                "kv_shared_layers": shared,
                "per_layer_input_size": int(meta.get("embedding_length_per_layer_input", 0) or 0),
                "final_logit_softcap": float(meta.get("final_logit_softcapping", 0.0) or 0.0),
                **experts_fields(meta, cfg["intermediate_size"])}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h, nh, n_pl, n = cfg.hidden_size, cfg.num_heads, cfg.per_layer_input_size, cfg.num_layers
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
        if not cfg.tie_word_embeddings:
            shapes["output.weight"] = (cfg.vocab_size, h)
        if any(cfg.layer_window(i) is None for i in range(n)):
            shapes["rope_freqs.weight"] = ((cfg.rope_dim or cfg.head_dim) // 2,)
        if n_pl:
            shapes.update({"per_layer_token_embd.weight": (cfg.vocab_size, n_pl * n),
                           "per_layer_model_proj.weight": (n_pl * n, h), "per_layer_proj_norm.weight": (n_pl,)})
        for i in range(n):
            p, d, kv, f = f"blk.{i}.", cfg.layer_head_dim(i), cfg.layer_kv_heads(i), cfg.ffn_per_layer[i]
            shapes.update({p + "attn_norm.weight": (h,), p + "attn_q.weight": (nh * d, h),
                           p + "attn_q_norm.weight": (d,), p + "attn_output.weight": (h, nh * d),
                           p + "post_attention_norm.weight": (h,), p + "ffn_norm.weight": (h,),
                           p + "ffn_gate.weight": (f, h), p + "ffn_up.weight": (f, h), p + "ffn_down.weight": (h, f),
                           p + "post_ffw_norm.weight": (h,)})
            if cfg.layer_kv_source(i) == i:
                shapes.update({p + "attn_k.weight": (kv * d, h), p + "attn_k_norm.weight": (d,)})
                if p + "attn_v.weight" in names:   # else V is K's projection (K = V)
                    shapes[p + "attn_v.weight"] = (kv * d, h)
            if p + "layer_output_scale.weight" in names:
                shapes[p + "layer_output_scale.weight"] = (1,)
            if n_pl:
                shapes.update({p + "inp_gate.weight": (n_pl, h), p + "proj.weight": (h, n_pl),
                               p + "post_norm.weight": (h,)})
            if p + "ffn_gate_inp.weight" in names:
                shapes.update(self._expert_shapes(cfg, p, names))
        return shapes

    @staticmethod
    def _expert_shapes(cfg: ModelConfig, p: str, names: set[str]) -> dict[str, tuple[int, ...]]:
        if not cfg.num_experts:
            raise ModelLoadError(f"gemma4: {p}ffn_gate_inp.weight without expert_count")
        h, e, ef = cfg.hidden_size, cfg.num_experts, cfg.expert_intermediate_size
        shapes = {p + "ffn_gate_inp.weight": (e, h), p + "ffn_gate_inp.scale": (h,), p + "pre_ffw_norm_2.weight": (h,),
                  p + "post_ffw_norm_1.weight": (h,), p + "post_ffw_norm_2.weight": (h,),
                  p + "ffn_down_exps.weight": (e, h, ef)}
        if p + "ffn_gate_up_exps.weight" in names:
            shapes[p + "ffn_gate_up_exps.weight"] = (e, 2 * ef, h)
        else:
            shapes.update({p + "ffn_gate_exps.weight": (e, ef, h), p + "ffn_up_exps.weight": (e, ef, h)})
        if p + "ffn_down_exps.scale" in names:
            shapes[p + "ffn_down_exps.scale"] = (e,)
        return shapes

    def prepare(self, w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
        """Merged experts (ffn_gate_up_exps: per expert gate rows then up rows) split into gate and up."""
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            if p + "ffn_gate_up_exps.weight" in w:
                w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"] = split_gate_up(
                    w.pop(p + "ffn_gate_up_exps.weight"))
        return w


FAMILY = Gemma4()
