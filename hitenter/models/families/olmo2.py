"""OLMo 2 and OLMo 3 (general.architecture "olmo2"): norms after each block only, x + post_norm(f(x)) with no
norm before attention or the FFN (`post_attention_norm`, `post_ffw_norm`), and QK-norm over the whole Q and
K projections (`attn_q_norm` [heads x head_dim], `attn_k_norm` [kv heads x head_dim]) before RoPE (NEOX, not
permuted).

OLMo 3 adds a sliding window (`attention.sliding_window` > 0): the local layers are those the file's
`attention.sliding_window_pattern` marks (a per-layer array, or a period: layer i local iff
i % period < period - 1; llama.cpp's default period 4, three local layers to one global). The local layers
rotate with the plain RoPE of `rope.freq_base` (llama.cpp's olmo2 graph passes freq_scale 1, ext_factor 0,
attn_factor 1 there); YaRN (`rope.scaling.type` yarn) applies to the global layers only."""

from __future__ import annotations

from typing import Any

from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Family, Meta

SWA_PERIOD = 4   # llama.cpp's load_swa_pattern default for olmo2


def swa_pattern(meta: Meta, n_layers: int, period: int) -> tuple[bool, ...]:
    """Each layer's local flag from `attention.sliding_window_pattern`: a per-layer array (ModelLoadError
    unless it has n_layers entries) or a period (`period` where absent), as llama.cpp's load_swa_pattern."""
    value = meta.get("attention.sliding_window_pattern", period)
    if isinstance(value, list | tuple):
        if len(value) != n_layers:
            raise ModelLoadError(f"GGUF metadata {meta.arch}.attention.sliding_window_pattern has {len(value)} "
                                 f"entries for {n_layers} layers")
        return tuple(bool(v) for v in value)
    p = int(value)
    return tuple(p == 0 or i % p < p - 1 for i in range(n_layers))


class OLMo2(Family):
    arch = "olmo2"

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"norm_placement": "post", "qk_norm": "full"}
        window = int(meta.get("attention.sliding_window", 0) or 0)
        if window > 0:   # OLMo 3
            out.update(sliding_window=window, swa_layers=swa_pattern(meta, cfg["num_layers"], SWA_PERIOD),
                       rope_local_theta=cfg["rope_theta"])
        return out


FAMILY = OLMo2()
