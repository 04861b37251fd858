"""A tiny random Pixtral mmproj GGUF (tests only), with the names and metadata llama.cpp's converter writes
(conversion/llava.py LlavaVisionModel for model_type pixtral, conversion/pixtral.py): clip.projector_type
pixtral, clip.use_silu, RMSNorm layers v.blk.N.{ln1,ln2} without biases, Q/K/V/out and SwiGLU FFN without
biases, v.pre_ln, the Mistral Small 3.1 patch merger (mm.input_norm, mm.patch_merger; spatial_merge_size),
the LLaVA projector mm.1 / mm.2 and the [IMG_BREAK] embedding v.token_embd.img_break. All tensors F32.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_mmproj import mmproj_header


def write_tiny_pixtral_mmproj(path: str | Path, seed: int = 0, text_hidden: int = 64, hidden: int = 32,
                              ffn: int = 48, layers: int = 2, heads: int = 2, patch_size: int = 8,
                              image_size: int = 64, merge: int = 2) -> Path:
    """A random Pixtral mmproj at `path` (`merge` 1: Pixtral 12B's layout, no patch merger)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def gain(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    mmproj_header(w, "tiny-pixtral-mmproj", gguf.VisionProjectorType.PIXTRAL, text_hidden=text_hidden, hidden=hidden,
                  ffn=ffn, layers=layers, heads=heads, image_size=image_size, patch_size=patch_size, eps=1e-5)
    w.add_vision_use_silu(True)
    if merge > 1:
        w.add_vision_spatial_merge_size(merge)
    w.add_tensor("v.patch_embd.weight", normal(hidden, 3, patch_size, patch_size, std=0.1))
    w.add_tensor("v.pre_ln.weight", gain(hidden))
    for i in range(layers):
        p = f"v.blk.{i}."
        w.add_tensor(p + "ln1.weight", gain(hidden))
        w.add_tensor(p + "ln2.weight", gain(hidden))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(p + name + ".weight", normal(hidden, hidden, std=0.25))
        w.add_tensor(p + "ffn_gate.weight", normal(ffn, hidden, std=0.2))
        w.add_tensor(p + "ffn_up.weight", normal(ffn, hidden, std=0.2))
        w.add_tensor(p + "ffn_down.weight", normal(hidden, ffn, std=0.2))
    if merge > 1:
        w.add_tensor("mm.input_norm.weight", gain(hidden))
        w.add_tensor("mm.patch_merger.weight", normal(hidden, hidden * merge * merge, std=0.1))
    w.add_tensor("mm.1.weight", normal(text_hidden, hidden, std=0.2))
    w.add_tensor("mm.1.bias", normal(text_hidden, std=0.05))
    w.add_tensor("mm.2.weight", normal(text_hidden, text_hidden, std=0.15))
    w.add_tensor("mm.2.bias", normal(text_hidden, std=0.05))
    w.add_tensor("v.token_embd.img_break", normal(text_hidden, std=0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
