"""nomic-bert-moe encoders (general.architecture "nomic-bert-moe": nomic-embed-text-v2-moe, an XLM-R vocabulary
read by tokenizer/ugm.py), as llama.cpp's bert graph runs them: nomic-bert's layout (post-residual
LayerNorms, embedding LayerNorm, token type row 0, no position embeddings, fused `attn_qkv` with its bias
where the file has one, RoPE NEOX over the whole head at `rope.freq_base`) with BERT's ungated GELU FFN
(`ffn_up`, `ffn_down`, biases) on the dense layers, and on every `moe_every_n_layers`-th layer (llama.cpp:
layer i with i % n == 1; only n = 2, the released model's, is read) a mixture of `expert_count` ungated
GELU experts (`ffn_up_exps`, `ffn_down_exps`, no biases), softmax router `ffn_gate_inp` over all experts,
the top `expert_used_count` weights as they are (not renormalized), times `expert_weights_scale` where the
file sets one."""

from __future__ import annotations

from typing import Any

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Meta, experts_fields
from hitenter.models.families.bert import Bert, encoder_common_shapes


class NomicBertMoe(Bert):
    arch = "nomic-bert-moe"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        step = int(meta.get("moe_every_n_layers", 0))
        if step not in (0, 2):
            raise ModelLoadError(f"nomic-bert-moe: moe_every_n_layers {step} is not supported (only 2, "
                                 "nomic-embed-text-v2-moe's)")
        out = {**super().fields(meta, cfg, names), "use_rope": True}
        if step:
            out.update(experts_fields(meta, cfg["intermediate_size"]), moe_layer_step=2, expert_norm_topk=False,
                       expert_gating="softmax",
                       expert_weights_scale=float(meta.get("expert_weights_scale", 0.0)))
        return out

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h, f, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        shapes = {"token_embd.weight": (cfg.vocab_size, h), **encoder_common_shapes(cfg, names)}
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            shapes[p + "attn_qkv.weight"] = (qkv, h)
            if p + "attn_qkv.bias" in names:
                shapes[p + "attn_qkv.bias"] = (qkv,)
            if cfg.layer_has_experts(i):
                for n in ("ffn_up.weight", "ffn_up.bias", "ffn_down.weight", "ffn_down.bias"):
                    shapes.pop(p + n, None)
                shapes.update({p + "ffn_gate_inp.weight": (e, h), p + "ffn_up_exps.weight": (e, f, h),
                               p + "ffn_down_exps.weight": (e, h, f)})
        return shapes


FAMILY = NomicBertMoe()
