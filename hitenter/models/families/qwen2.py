"""Qwen2 / Qwen2.5 (general.architecture "qwen2"): Llama with biases on Q, K and V (read from the tensors),
NEOX RoPE, so the GGUF's Q/K are not permuted."""

from __future__ import annotations

from hitenter.models.families.base import Family


class Qwen2(Family):
    arch = "qwen2"


FAMILY = Qwen2()
