"""LFM2 / LFM2.5 (general.architecture "lfm2"; llama.cpp src/models/lfm2.cpp): a hybrid of gated short
convolutions (models/recurrent/short_conv.py) and GQA attention with per-head QK-norm and NEOX RoPE
(Q/K not permuted), every layer with a SwiGLU FFN:

    x = x + mixer(rms(x, attn_norm));  x = x + ffn(rms(x, ffn_norm));  logits = output(rms(x, token_embd_norm))

Which layers attend comes from the file: `attention.head_count_kv` is a per-layer array, 0 for a
convolution layer (as llama.cpp's is_recr). `shortconv.l_cache` is the convolution's taps. The output norm
is stored as `token_embd_norm` (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2), renamed here to `output_norm`.
A sliding-window LFM2 (attention.sliding_window > 0) is refused at load.
"""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Family, Meta, per_layer


def attention_layer_types(meta: Meta, n: int, recurrent: str) -> tuple[str, ...]:
    """Per layer "attention", or `recurrent` where the file's head_count_kv entry is 0; the attention layers
    must share one KV head count (ModelLoadError otherwise)."""
    kv = per_layer(meta, "attention.head_count_kv", n, int(meta.require("attention.head_count")))
    if len({k for k in kv if k}) > 1:
        raise ModelLoadError(f"{meta.arch}: attention layers with different KV head counts {sorted(set(kv))} "
                             "are not supported")
    return tuple(recurrent if k == 0 else "attention" for k in kv)


def attention_shapes(cfg: ModelConfig, p: str, qk_norm: bool) -> dict[str, tuple[int, ...]]:
    """An attention layer's projections (and per-head QK-norm weights), torch order."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    out = {p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
           p + "attn_output.weight": (h, q)}
    if qk_norm:
        out.update({p + "attn_q_norm.weight": (d,), p + "attn_k_norm.weight": (d,)})
    return out


def embedding_shapes(cfg: ModelConfig, output_norm: str = "output_norm") -> dict[str, tuple[int, ...]]:
    """The token embedding, the final norm (stored as `output_norm`) and, untied, the output head."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out = {"token_embd.weight": (v, h), output_norm + ".weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (v, h)
    return out


def gated_ffn_shapes(h: int, f: int, p: str, suffix: str = "") -> dict[str, tuple[int, ...]]:
    return {p + f"ffn_gate{suffix}.weight": (f, h), p + f"ffn_up{suffix}.weight": (f, h),
            p + f"ffn_down{suffix}.weight": (h, f)}


def experts_shapes(cfg: ModelConfig, p: str, gated: bool = True) -> dict[str, tuple[int, ...]]:
    e, f, h = cfg.num_experts, cfg.expert_intermediate_size, cfg.hidden_size
    out = {p + "ffn_gate_inp.weight": (e, h), p + "ffn_up_exps.weight": (e, f, h), p + "ffn_down_exps.weight": (e, h, f)}
    if gated:
        out[p + "ffn_gate_exps.weight"] = (e, f, h)
    return out


class LFM2(Family):
    arch = "lfm2"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        if int(meta.get("attention.sliding_window", 0) or 0) > 0:
            raise ModelLoadError(f"{self.arch}: sliding-window attention (attention.sliding_window) is not "
                                 "supported for this architecture")
        return {"layer_types": attention_layer_types(meta, cfg["num_layers"], "short_conv"),
                "ssm_conv_kernel": int(meta.require("shortconv.l_cache")), "qk_norm": "head"}

    def dense_layers(self, cfg: ModelConfig) -> int:
        """Layers with a dense FFN (the rest: experts)."""
        return cfg.num_layers

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h = cfg.hidden_size
        shapes = embedding_shapes(cfg, "token_embd_norm")
        for i, kind in enumerate(cfg.layer_types):
            p = f"blk.{i}."
            shapes.update({p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,)})
            if kind == "attention":
                shapes.update(attention_shapes(cfg, p, qk_norm=True))
            else:
                shapes.update({p + "shortconv.in_proj.weight": (3 * h, h), p + "shortconv.out_proj.weight": (h, h),
                               p + "shortconv.conv.weight": (h, cfg.ssm_conv_kernel)})
            if i < self.dense_layers(cfg):
                shapes.update(gated_ffn_shapes(h, cfg.intermediate_size, p))
            else:
                shapes.update(experts_shapes(cfg, p))
                shapes[p + "exp_probs_b.bias"] = (cfg.num_experts,)
        return shapes

    def prepare(self, w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
        w["output_norm.weight"] = w.pop("token_embd_norm.weight")
        return w


FAMILY = LFM2()
