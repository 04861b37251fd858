"""A tiny random Gemma 3-shaped GGUF (tests only): tiny_model.py's GPT-2-style vocabulary and chat template,
Gemma 3 tensors (QK-norm, pre/post norms, GeGLU, tied embedding) and a short sliding window, so that a
few dozen tokens already run past the local layers' window.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_model import add_shape, add_tokenizer, add_weight


def write_tiny_gemma3(path: str | Path, seed: int = 0, hidden: int = 64, layers: int = 4, heads: int = 4,
                      kv_heads: int = 2, head_dim: int = 32, ffn: int = 128, window: int = 8, pattern: int = 2,
                      context_length: int = 256, quant: str | None = None) -> Path:
    """Write a random Gemma 3 model (layer i global when (i + 1) % pattern == 0, the others see `window`
    keys) to `path`; return it. All tensors F32, or the layers' 2-D projections in `quant` (a GGML type
    name such as "Q8_0"; see tiny_model.add_weight)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arch = "gemma3"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-gemma3")
    add_shape(w, layers, context_length, hidden, ffn, heads, kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    w.add_uint32(f"{arch}.attention.sliding_window_pattern", pattern)
    vocab = add_tokenizer(w)
    qtype = None if quant is None else gguf.GGMLQuantizationType[quant]

    def add(name: str, arr: np.ndarray) -> None:   # the layers' projections in `quant`, the rest F32
        add_weight(w, name, arr, qtype if name.startswith("blk.") else None, rng)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:   # stored as 1 + w, like convert_hf_to_gguf
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    add("token_embd.weight", normal(vocab, hidden, std=0.1))
    add("output_norm.weight", norm(hidden))
    for i in range(layers):
        p = f"blk.{i}."
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            add(p + name + ".weight", norm(hidden))
        add(p + "attn_q_norm.weight", norm(head_dim))
        add(p + "attn_k_norm.weight", norm(head_dim))
        add(p + "attn_q.weight", normal(heads * head_dim, hidden, std=0.15))
        add(p + "attn_k.weight", normal(kv_heads * head_dim, hidden, std=0.15))
        add(p + "attn_v.weight", normal(kv_heads * head_dim, hidden, std=0.1))
        add(p + "attn_output.weight", normal(hidden, heads * head_dim, std=0.1))
        add(p + "ffn_gate.weight", normal(ffn, hidden, std=0.1))
        add(p + "ffn_up.weight", normal(ffn, hidden, std=0.1))
        add(p + "ffn_down.weight", normal(hidden, ffn, std=0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
