"""Qwen3.5 / 3.6 (general.architecture "qwen35"): a hybrid of Gated DeltaNet layers
(models/recurrent/gated_deltanet.py) and gated attention every `full_attention_interval`-th layer (or where
`attention.recurrent_layers` says false), as llama.cpp's src/models/qwen35.cpp builds it:

    h   = x + mixer(rms(x, attn_norm))
    out = h + ffn(rms(h, post_attention_norm))     # the file's post_attention_norm is the FFN's input norm

The attention layers: the Q projection holds per head D query rows then D gate rows; per-head QK-norm
(attn_q_norm / attn_k_norm, [D]) before RoPE; output x sigmoid(gate) before attn_output; scale 1/sqrt(D),
D = attention.key_length. RoPE: llama.cpp's interleaved multi-axis RoPE (IMROPE) over
rope.dimension_count dims with rope.dimension_sections; a text token has the same position on the three
used axes, so where every rotated pair falls on those axes (checked at load: real files' sections do) it
is partial NEOX RoPE over the first rope.dimension_count dims of each head. The FFN is SwiGLU.

The MTP (next-token prediction) blocks that convert_hf_to_gguf appends after the trunk
(`nextn_predict_layers` of the `block_count` layers) are not part of the forward pass: the model neither
reads nor requires them; speculative_method "mtp" loads the block as a drafter (hitenter/models/mtp.py). Stored norms are used as they are (the converter adds 1 to them already).
"""

from __future__ import annotations

from typing import Any

import torch

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models.experts import ExpertWeight
from hitenter.models.families.base import Family, Meta

_TAKEN = ("t", "h", "w")   # the IMROPE axes that carry a text token's position (the 4th, "e", is 0)


def imrope_axis(pair: int, sections: list[int]) -> str:
    """The position axis ("t", "h", "w" or "e") ggml's interleaved multi-axis RoPE uses for rotated pair
    ``pair`` (ggml_mrope_cache_init with is_imrope)."""
    sector = pair % sum(sections)
    if sector % 3 == 1 and sector < 3 * sections[1]:
        return "h"
    if sector % 3 == 2 and sector < 3 * sections[2]:
        return "w"
    if sector % 3 == 0 and sector < 3 * sections[0]:
        return "t"
    return "e"


def check_text_rope(meta: Meta, rope_dim: int) -> None:
    """ModelLoadError unless every pair of the rotated dims takes a text position axis (then the
    multi-axis RoPE of text tokens is plain partial NEOX RoPE)."""
    sections = [int(s) for s in meta.require("rope.dimension_sections")][:4]
    sections += [0] * (4 - len(sections))
    if sum(sections) <= 0:
        raise ModelLoadError(f"{meta.arch}: rope.dimension_sections {sections} has no dimensions")
    bad = [i for i in range(rope_dim // 2) if imrope_axis(i, sections) not in _TAKEN]
    if bad:
        raise ModelLoadError(f"{meta.arch}: rope.dimension_sections {sections} rotate pairs {bad[:4]} by the 4th "
                             "(extra) position axis; hitenter supports text positions on the first three only")


def layer_kinds(meta: Meta, n_all: int, n: int) -> tuple[str, ...]:
    """Each trunk layer's mixer, as llama.cpp reads it: attention.recurrent_layers (one flag per layer of
    block_count) where the file has it, else recurrent unless (i + 1) % full_attention_interval == 0."""
    flags = meta.get("attention.recurrent_layers")
    if flags is not None:
        if len(flags) != n_all:
            raise ModelLoadError(f"GGUF metadata {meta.arch}.attention.recurrent_layers has {len(flags)} entries "
                                 f"for {n_all} layers")
        recurrent = [bool(f) for f in flags[:n]]
    else:
        interval = int(meta.get("full_attention_interval", 4))
        if interval <= 0:
            raise ModelLoadError(f"GGUF metadata {meta.arch}.full_attention_interval must be > 0, got {interval}")
        recurrent = [(i + 1) % interval != 0 for i in range(n)]
    return tuple("gated_deltanet" if r else "attention" for r in recurrent)


class Qwen35(Family):
    arch = "qwen35"
    moe = False              # routed experts + the sigmoid-gated shared expert in every layer
    multi_axis_rope = True   # rope.dimension_sections (IMROPE); False: plain NEOX (qwen3next)
    grouped_heads = False    # value heads grouped by key head (qwen3next), not tiled

    def config(self, values: dict[str, Any], names: set[str] | None) -> ModelConfig:
        key = f"{self.arch}.feed_forward_length"
        if self.moe and key not in values:   # an MoE file may have no dense FFN width
            values = {**values, key: values.get(f"{self.arch}.expert_shared_feed_forward_length",
                                                values.get(f"{self.arch}.expert_feed_forward_length", 0))}
        return super().config(values, names)

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        n_all = cfg["num_layers"]
        nextn = int(meta.get("nextn_predict_layers", 0))
        if not 0 <= nextn < n_all:
            raise ModelLoadError(f"{meta.arch}: nextn_predict_layers {nextn} of {n_all} blocks leaves no trunk")
        n = n_all - nextn
        rope_dim = cfg["rope_dim"] or cfg["head_dim"]
        if self.multi_axis_rope:
            check_text_rope(meta, rope_dim)
        out: dict[str, Any] = {
            "num_layers": n, "layer_types": layer_kinds(meta, n_all, n), "attn_output_gate": True,
            "qk_norm": "head", "ssm_conv_kernel": int(meta.require("ssm.conv_kernel")),
            "ssm_state_size": int(meta.require("ssm.state_size")),
            "ssm_group_count": int(meta.require("ssm.group_count")),
            "ssm_time_step_rank": int(meta.require("ssm.time_step_rank")),
            "ssm_inner_size": int(meta.require("ssm.inner_size")), "ssm_grouped_heads": self.grouped_heads}
        if self.moe:
            n_expert, used = int(meta.require("expert_count")), int(meta.require("expert_used_count"))
            ffn = cfg["intermediate_size"]
            out.update(num_experts=n_expert, num_experts_used=used,
                       expert_intermediate_size=int(meta.get("expert_feed_forward_length", 0)) or ffn // used,
                       intermediate_size=int(meta.get("expert_shared_feed_forward_length", 0)) or ffn)
        return out

    # ---- tensors ----------------------------------------------------------------------------------------
    def _attention_shapes(self, cfg: ModelConfig, p: str, names: set[str]) -> dict[str, tuple[int, ...]]:
        h, d = cfg.hidden_size, cfg.head_dim
        q, kv = 2 * cfg.num_heads * d, cfg.num_kv_heads * d
        qkv = {p + "attn_qkv.weight": (q + 2 * kv, h)} if p + "attn_qkv.weight" in names else {
            p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h)}
        return {**qkv, p + "attn_output.weight": (h, q // 2), p + "attn_q_norm.weight": (d,),
                p + "attn_k_norm.weight": (d,)}

    def _recurrent_shapes(self, cfg: ModelConfig, p: str, names: set[str]) -> dict[str, tuple[int, ...]]:
        h, hv = cfg.hidden_size, cfg.ssm_time_step_rank
        vd = cfg.ssm_inner_size
        conv = 2 * cfg.ssm_group_count * cfg.ssm_state_size + vd
        if p + "ssm_in.weight" in names:    # Qwen3-Next's older files: q, k, v, z fused per key head
            proj = {p + "ssm_in.weight": (conv + vd, h)}
        else:
            proj = {p + "attn_qkv.weight": (conv, h), p + "attn_gate.weight": (vd, h)}
        if self.grouped_heads:
            proj[p + "ssm_ba.weight"] = (2 * hv, h)
        else:
            proj.update({p + "ssm_beta.weight": (hv, h), p + "ssm_alpha.weight": (hv, h)})
        return {**proj, p + "ssm_conv1d.weight": (conv, cfg.ssm_conv_kernel), p + "ssm_dt.bias": (hv,),
                p + "ssm_a": (hv,), p + "ssm_norm.weight": (vd // hv,), p + "ssm_out.weight": (h, vd)}

    def _ffn_shapes(self, cfg: ModelConfig, p: str, names: set[str]) -> dict[str, tuple[int, ...]]:
        h, f = cfg.hidden_size, cfg.intermediate_size
        dense = {p + "ffn_gate.weight": (f, h), p + "ffn_up.weight": (f, h), p + "ffn_down.weight": (h, f)}
        if not self.moe:
            return dense
        e, ef = cfg.num_experts, cfg.expert_intermediate_size
        gate_up = {p + "ffn_gate_up_exps.weight": (e, 2 * ef, h)} if p + "ffn_gate_up_exps.weight" in names else {
            p + "ffn_gate_exps.weight": (e, ef, h), p + "ffn_up_exps.weight": (e, ef, h)}
        return {p + "ffn_gate_inp.weight": (e, h), **gate_up, p + "ffn_down_exps.weight": (e, h, ef),
                p + "ffn_gate_inp_shexp.weight": (h,),
                **{k.replace("ffn_gate.", "ffn_gate_shexp.").replace("ffn_up.", "ffn_up_shexp.")
                   .replace("ffn_down.", "ffn_down_shexp."): v for k, v in dense.items()}}

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        h = cfg.hidden_size
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
        if not cfg.tie_word_embeddings:
            shapes["output.weight"] = (cfg.vocab_size, h)
        for i, kind in enumerate(cfg.layer_types):
            p = f"blk.{i}."
            shapes.update({p + "attn_norm.weight": (h,), p + "post_attention_norm.weight": (h,)})
            if kind == "attention":
                shapes.update(self._attention_shapes(cfg, p, names))
            else:
                shapes.update(self._recurrent_shapes(cfg, p, names))
            shapes.update(self._ffn_shapes(cfg, p, names))
        return shapes

    def prepare(self, w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
        """post_attention_norm -> ffn_norm; a fused attention attn_qkv -> attn_q / k / v; merged experts
        ffn_gate_up_exps (per expert, gate rows then up rows) -> ffn_gate_exps / ffn_up_exps; Qwen3-Next's
        ssm_ba -> ssm_beta / ssm_alpha and its older ssm_in -> attn_qkv / attn_gate (row reorders only)."""
        for i, kind in enumerate(cfg.layer_types):
            p = f"blk.{i}."
            w[p + "ffn_norm.weight"] = w.pop(p + "post_attention_norm.weight")
            if p + "ffn_gate_up_exps.weight" in w:
                w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"] = split_gate_up(
                    w.pop(p + "ffn_gate_up_exps.weight"))
            if kind == "attention" and p + "attn_qkv.weight" in w:
                q, kv = 2 * cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
                qkv = w.pop(p + "attn_qkv.weight")
                for name, start, size in (("attn_q", 0, q), ("attn_k", q, kv), ("attn_v", q + kv, kv)):
                    w[p + name + ".weight"] = qkv.narrow(0, start, size)
            if kind != "attention" and p + "ssm_in.weight" in w:
                qkv_rows, z_rows = ssm_in_rows(cfg)
                fused = w.pop(p + "ssm_in.weight")
                w[p + "attn_qkv.weight"], w[p + "attn_gate.weight"] = _rows(fused, qkv_rows), _rows(fused, z_rows)
            if kind != "attention" and p + "ssm_ba.weight" in w:
                beta_rows, alpha_rows = ssm_ba_rows(cfg)
                ba = w.pop(p + "ssm_ba.weight")
                w[p + "ssm_beta.weight"], w[p + "ssm_alpha.weight"] = _rows(ba, beta_rows), _rows(ba, alpha_rows)
        return w


def split_gate_up(w: Any) -> tuple[Any, Any]:
    """Merged experts [E, 2F, H] (llama.cpp's ffn_gate_up_exps: per expert F gate rows then F up rows), as
    the loader holds them (an ExpertWeight of blocks or fp32), split into the gate and the up experts."""
    if isinstance(w, torch.Tensor):
        f = w.shape[1] // 2
        return w[:, :f].contiguous(), w[:, f:].contiguous()
    e, f, h = w.n_expert, w.out_features // 2, w.in_features
    if w.blocks is None:
        return (ExpertWeight(e, f, h, dense=w.dense[:, :f].contiguous()),
                ExpertWeight(e, f, h, dense=w.dense[:, f:].contiguous()))
    first = (torch.arange(e)[:, None] * (2 * f) + torch.arange(f)).flatten()
    return (ExpertWeight(e, f, h, blocks=w.blocks.index_rows(first)),
            ExpertWeight(e, f, h, blocks=w.blocks.index_rows(first + f)))


def _rows(w: Any, rows: torch.Tensor) -> Any:
    """Rows of a dense tensor or of a block weight (BlockWeight.index_rows), in the given order."""
    return w.index_select(0, rows) if hasattr(w, "index_select") else w.index_rows(rows)


def ssm_in_rows(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices into Qwen3-Next's fused ssm_in ([q dk | k dk | v r dv | z r dv] per key head, r = value
    heads per key head) that give attn_qkv (all q, all k, all v) and attn_gate (all z)."""
    hk, dk, hv = cfg.ssm_group_count, cfg.ssm_state_size, cfg.ssm_time_step_rank
    vr = (hv // hk) * (cfg.ssm_inner_size // hv)
    group = torch.arange(hk)[:, None] * (2 * dk + 2 * vr)
    q, k = group + torch.arange(dk), group + dk + torch.arange(dk)
    v, z = group + 2 * dk + torch.arange(vr), group + 2 * dk + vr + torch.arange(vr)
    return torch.cat([q.flatten(), k.flatten(), v.flatten()]), z.flatten()


def ssm_ba_rows(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices into Qwen3-Next's fused ssm_ba ([beta r | alpha r] per key head) of beta and alpha, value
    head order."""
    hk, hv = cfg.ssm_group_count, cfg.ssm_time_step_rank
    r = hv // hk
    group = torch.arange(hk)[:, None] * (2 * r)
    return (group + torch.arange(r)).flatten(), (group + r + torch.arange(r)).flatten()


FAMILY = Qwen35()
