"""Granite 4 hybrids (general.architecture "granitehybrid"; llama.cpp src/models/granite-hybrid.cpp):
Mamba2 layers (models/recurrent/mamba2.py) beside GQA attention layers, each layer with a SwiGLU FFN or a
mixture of experts (softmax routing, renormalised top-k, expert width feed_forward_length) plus a shared
SwiGLU expert where the file has ffn_*_shexp (expert_shared_feed_forward_length wide, added ungated):

    x0 = token_embd[ids] * embedding_scale
    x = x + residual_scale * mixer(rms(x, attn_norm));  x = x + residual_scale * ffn(rms(x, ffn_norm))
    logits = output(rms(x, output_norm)) / logit_scale;  attention's Q.K scale: attention.scale

A layer is Mamba2 where the per-layer attention.head_count_kv is 0. RoPE only where
rope.scaling.finetuned is true (llama.cpp's default when the key is absent; the converter writes false for
every hybrid), then NORM RoPE with Q/K permuted by the converter (un-permuted here). Attention or FFN
biases (optional in llama.cpp's loader) are refused at load.
"""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Family, Meta, experts_fields, unpermute_qk
from hitenter.models.families.lfm2 import (
    attention_layer_types,
    attention_shapes,
    embedding_shapes,
    experts_shapes,
    gated_ffn_shapes,
)


def ssm_fields(meta: Meta) -> dict[str, Any]:
    """Mamba2's hyper-parameters (llama.cpp's ssm.* keys)."""
    return {"ssm_conv_kernel": int(meta.require("ssm.conv_kernel")), "ssm_inner_size": int(meta.require("ssm.inner_size")),
            "ssm_state_size": int(meta.require("ssm.state_size")),
            "ssm_time_step_rank": int(meta.require("ssm.time_step_rank")),
            "ssm_group_count": int(meta.require("ssm.group_count"))}


def mamba2_shapes(cfg: ModelConfig, p: str, names: set[str]) -> dict[str, tuple[int, ...]]:
    """A Mamba2 layer's tensors, torch order (the conv bias where the file has one)."""
    h, e, n, g, nh = cfg.hidden_size, cfg.ssm_inner_size, cfg.ssm_state_size, cfg.ssm_group_count, cfg.ssm_time_step_rank
    c = e + 2 * g * n
    out = {p + "ssm_in.weight": (2 * e + 2 * g * n + nh, h), p + "ssm_conv1d.weight": (c, cfg.ssm_conv_kernel),
           p + "ssm_dt.bias": (nh,), p + "ssm_a": (nh, 1), p + "ssm_d": (nh, 1),
           p + "ssm_norm.weight": (g, e // g), p + "ssm_out.weight": (h, e)}
    if p + "ssm_conv1d.bias" in names:
        out[p + "ssm_conv1d.bias"] = (c,)
    return out


def refuse_biases(arch: str, names: set[str]) -> None:
    """ModelLoadError where the file has attention or FFN biases (hitenter's hybrid layers have none)."""
    parts = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "ffn_up.bias", "ffn_down.bias",
             "ffn_gate.bias")
    found = sorted(name for name in names if name.endswith(parts))
    if found:
        raise ModelLoadError(f"{arch}: attention / FFN biases ({found[0]}, ...) are not supported")


class GraniteHybrid(Family):
    arch = "granitehybrid"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        refuse_biases(self.arch, names)
        logit_scale = float(meta.get("logit_scale", 1.0)) or 1.0
        out = {"layer_types": attention_layer_types(meta, cfg["num_layers"], "mamba2"),
               "use_rope": bool(meta.get("rope.scaling.finetuned", True)),
               "embedding_scale": float(meta.get("embedding_scale", 1.0)),
               "residual_scale": float(meta.get("residual_scale", 1.0)),
               "attention_scale": float(meta.get("attention.scale", 0.0)), "logit_scale": 1.0 / logit_scale,
               **ssm_fields(meta)}
        ffn = cfg["intermediate_size"]
        out.update(experts_fields(meta, ffn))
        if out.get("num_experts"):   # experts feed_forward_length wide; the shared one (if any) its own width
            out.update(expert_intermediate_size=ffn, expert_norm_topk=True,
                       intermediate_size=int(meta.get("expert_shared_feed_forward_length", 0)) or ffn)
        return out

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h = cfg.hidden_size
        shapes = embedding_shapes(cfg)
        for i, kind in enumerate(cfg.layer_types):
            p = f"blk.{i}."
            shapes.update({p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,)})
            shapes.update(attention_shapes(cfg, p, qk_norm=False) if kind == "attention" else mamba2_shapes(cfg, p, names))
            if cfg.num_experts:
                shapes.update(experts_shapes(cfg, p))
                if p + "ffn_down_shexp.weight" in names:   # the shared expert: intermediate_size wide
                    shapes.update(gated_ffn_shapes(h, cfg.intermediate_size, p, "_shexp"))
            else:
                shapes.update(gated_ffn_shapes(h, cfg.intermediate_size, p))
        return shapes

    def prepare(self, w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
        if cfg.use_rope:
            for i, kind in enumerate(cfg.layer_types):
                if kind == "attention":
                    w[f"blk.{i}.attn_q.weight"] = unpermute_qk(w[f"blk.{i}.attn_q.weight"], cfg.num_heads)
                    w[f"blk.{i}.attn_k.weight"] = unpermute_qk(w[f"blk.{i}.attn_k.weight"], cfg.num_kv_heads)
        return w


FAMILY = GraniteHybrid()
