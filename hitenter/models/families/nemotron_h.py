"""Nemotron-H (general.architecture "nemotron_h"; llama.cpp src/models/nemotron-h.cpp): each layer is ONE
of a Mamba2 mixer (models/recurrent/mamba2.py), GQA attention without RoPE, or a squared-ReLU FFN, each
behind its only norm:

    x = x + part(rms(x, attn_norm));  logits = output(rms(x, output_norm))
    ffn(y) = ffn_down(relu(ffn_up(y))^2)         (ungated)

The kind comes from the per-layer arrays as llama.cpp reads them: feed_forward_length > 0 is an FFN layer,
else head_count_kv > 0 attention, else Mamba2. Attention's Q.K scale: 1/sqrt(key_length). Biases are refused
at load; a converter's appended MTP blocks are left out (not served as a drafter yet).
"""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Family, Meta, per_layer
from hitenter.models.families.granitehybrid import mamba2_shapes, refuse_biases, ssm_fields
from hitenter.models.families.lfm2 import attention_shapes, embedding_shapes


def nemotron_layer_types(meta: Meta, n: int) -> tuple[str, ...]:
    kv = per_layer(meta, "attention.head_count_kv", n)
    ff = per_layer(meta, "feed_forward_length", n)
    if len({k for k in kv if k}) > 1:
        raise ModelLoadError(f"{meta.arch}: attention layers with different KV head counts are not supported")
    return tuple("ffn" if f else "attention" if k else "mamba2" for k, f in zip(kv, ff, strict=True))


class NemotronH(Family):
    arch = "nemotron_h"

    def config(self, values: dict[str, Any], names: set[str] | None) -> ModelConfig:
        """llama.cpp's eps: attention.layer_norm_rms_epsilon, else attention.layer_norm_epsilon. The MTP
        blocks a converter appends (nextn_predict_layers) are not layers of the model: block_count and the
        per-layer arrays are cut to the trunk (their tensors are not read)."""
        a = self.arch
        rms, plain = f"{a}.attention.layer_norm_rms_epsilon", f"{a}.attention.layer_norm_epsilon"
        if rms not in values and plain in values:
            values = {**values, rms: values[plain]}
        nextn = int(values.get(f"{a}.nextn_predict_layers", 0) or 0)
        if nextn:
            n = int(values[f"{a}.block_count"]) - nextn
            values = {k: v[:n] if k.startswith(f"{a}.") and isinstance(v, list) and len(v) == n + nextn else v
                      for k, v in values.items()}
            values[f"{a}.block_count"] = n
        return super().config(values, names)

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        refuse_biases(self.arch, names)
        return {"layer_types": nemotron_layer_types(meta, cfg["num_layers"]), "use_rope": False,
                "activation": "relu2", **ssm_fields(meta)}

    def ffn_shapes(self, cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
        h, f = cfg.hidden_size, cfg.intermediate_size
        return {p + "ffn_up.weight": (f, h), p + "ffn_down.weight": (h, f)}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h = cfg.hidden_size
        shapes = embedding_shapes(cfg)
        for i, kind in enumerate(cfg.layer_types):
            p = f"blk.{i}."
            shapes[p + "attn_norm.weight"] = (h,)
            if kind == "mamba2":
                shapes.update(mamba2_shapes(cfg, p, names))
            elif kind == "attention":
                shapes.update(attention_shapes(cfg, p, qk_norm=False))
            else:
                shapes.update(self.ffn_shapes(cfg, p))
        return shapes


FAMILY = NemotronH()
