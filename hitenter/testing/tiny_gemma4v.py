"""A tiny random Gemma 4 vision mmproj GGUF (tests only), with the names and metadata llama.cpp's converter
writes (conversion/gemma.py Gemma4VisionAudioModel, MmprojModel): clip.projector_type gemma4v, no
clip.use_gelu / use_silu key (the converter writes neither), RMSNorm layers v.blk.N.{ln1, ln2,
attn_post_norm, ffn_post_norm} and per-head attn_q_norm / attn_k_norm, bias-free Q/K/V/out and gated FFN,
the one-value layer scale v.blk.N.out_scale, the [2, positions, D] position table v.position_embd, the
standardization v.std_bias / v.std_scale, mm.input_projection [text hidden, D] and Gemma4ClippableLinear
bounds (one-element `<weight>.input_min` / `input_max` / `output_min` / `output_max` tensors) on a few
projections, tight enough to clip some values. All tensors F32.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_mmproj import mmproj_header

MAX_TOKENS = 1120   # clip.cpp's token limit for gemma4v: no image's grid side goes past MAX_TOKENS x merge patches


def write_tiny_gemma4v_mmproj(path: str | Path, seed: int = 0, text_hidden: int = 64, hidden: int = 32,
                              ffn: int = 48, layers: int = 2, heads: int = 2, patch_size: int = 4,
                              merge: int = 3, positions: int | None = None, clamps: bool = True) -> Path:
    """A random Gemma 4 vision mmproj at `path`; the position table holds `positions` patches per side
    (default: the most any image can have, MAX_TOKENS x merge). Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def gain(n: int, scale: float = 1.0) -> np.ndarray:
        return (scale * (1.0 + rng.standard_normal(n) * 0.1)).astype(np.float32)

    def one(v: float) -> np.ndarray:
        return np.array([v], dtype=np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    mmproj_header(w, "tiny-gemma4v-mmproj", gguf.VisionProjectorType.GEMMA4V, text_hidden=text_hidden, hidden=hidden,
                  ffn=ffn, layers=layers, heads=heads, image_size=224, patch_size=patch_size)
    if merge != 3:
        w.add_vision_projector_scale_factor(merge)
    w.add_tensor("v.patch_embd.weight", normal(hidden, 3, patch_size, patch_size, std=0.15))
    w.add_tensor("v.position_embd.weight", normal(2, positions or MAX_TOKENS * merge, hidden, std=0.3))
    for i in range(layers):
        p = f"v.blk.{i}."
        w.add_tensor(p + "ln1.weight", gain(hidden))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(p + name + ".weight", normal(hidden, hidden, std=0.25))
        w.add_tensor(p + "attn_q_norm.weight", gain(head_dim, 0.5))
        w.add_tensor(p + "attn_k_norm.weight", gain(head_dim, 0.5))
        w.add_tensor(p + "attn_post_norm.weight", gain(hidden))
        w.add_tensor(p + "ln2.weight", gain(hidden))
        w.add_tensor(p + "ffn_gate.weight", normal(ffn, hidden, std=0.25))
        w.add_tensor(p + "ffn_up.weight", normal(ffn, hidden, std=0.25))
        w.add_tensor(p + "ffn_down.weight", normal(hidden, ffn, std=0.2))
        w.add_tensor(p + "ffn_post_norm.weight", gain(hidden))
        w.add_tensor(p + "out_scale.weight", one(0.8 + 0.1 * i))
        if clamps:   # unit-RMS inputs: |x| past 2 and outputs past 1.5 are clipped at a few per cent of values
            for name in ("attn_q", "ffn_up"):
                w.add_tensor(p + name + ".input_min", one(-2.0))
                w.add_tensor(p + name + ".input_max", one(2.0))
                w.add_tensor(p + name + ".output_min", one(-1.5))
                w.add_tensor(p + name + ".output_max", one(1.5))
    w.add_tensor("v.std_bias", normal(hidden, std=0.5))
    w.add_tensor("v.std_scale", gain(hidden, 0.7))
    w.add_tensor("mm.input_projection.weight", normal(text_hidden, hidden, std=0.3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
