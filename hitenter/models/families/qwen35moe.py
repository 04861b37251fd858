"""Qwen3.5 / 3.6 MoE (general.architecture "qwen35moe", e.g. Qwen3.6-35B-A3B): qwen35's hybrid layers
(families/qwen35.py) with a mixture of experts in every layer, as llama.cpp's src/models/qwen35moe.cpp:
`expert_count` experts of `expert_feed_forward_length`, `expert_used_count` per token, softmax router over
all experts, the top-k weights renormalised to sum to 1 (build_moe_ffn, SOFTMAX gating, norm_w), plus a
shared SwiGLU expert of `expert_shared_feed_forward_length` scaled by sigmoid(ffn_gate_inp_shexp . x)."""

from __future__ import annotations

from hitenter.models.families.qwen35 import Qwen35


class Qwen35MoE(Qwen35):
    arch = "qwen35moe"
    moe = True


FAMILY = Qwen35MoE()
