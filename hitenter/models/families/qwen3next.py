"""Qwen3-Next and Qwen3-Coder-Next (general.architecture "qwen3next"): qwen35moe's hybrid MoE layers
(families/qwen35.py) with what llama.cpp's src/models/qwen3next.cpp does differently:

- RoPE: plain NEOX over rope.dimension_count dims (ggml_rope_ext; no dimension_sections);
- the value heads are grouped by key head (convert_hf_to_gguf does not reorder them for Qwen3-Next):
  value head h reads key head h // (value heads / key heads) (ModelConfig.ssm_grouped_heads);
- beta and alpha come from one projection `ssm_ba`, [beta r | alpha r] per key head (r = value heads per
  key head), split at load; older files also fuse q, k, v, z in `ssm_in` ([q | k | v r | z r] per key head),
  split at load into attn_qkv / attn_gate (row reorders only, any weight format)."""

from __future__ import annotations

from hitenter.models.families.qwen35 import Qwen35


class Qwen3Next(Qwen35):
    arch = "qwen3next"
    moe = True
    multi_axis_rope = False
    grouped_heads = True


FAMILY = Qwen3Next()
