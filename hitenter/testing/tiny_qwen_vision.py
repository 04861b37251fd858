"""Tiny random Qwen-VL GGUFs (tests only): mmproj files with the names and metadata llama.cpp's converter
writes (conversion/qwenvl.py Qwen2VLVisionModel, conversion/qwen3vl.py Qwen3VLVisionModel: the 3D patch
kernel split into v.patch_embd.weight / .weight.1, Q/K/V split (Qwen2.5-VL) or fused attn_qkv (Qwen3-VL),
the merger as mm.0 / mm.2, merger.ln_q / merger.norm as v.post_ln, DeepStack mergers as v.deepstack.N.*),
and the matching text models (general.architecture qwen2vl: Qwen2 with rope.dimension_sections, M-RoPE;
qwen3vl: Qwen3 with QK-norm, interleaved M-RoPE sections and n_deepstack_layers). All tensors F32.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_mmproj import mmproj_header
from hitenter.testing.tiny_model import add_shape, add_tokenizer


def _close(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tools(rng: np.random.Generator) -> tuple[Callable[..., np.ndarray], Callable[[int], np.ndarray]]:
    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def gain(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    return normal, gain


def write_tiny_qwen25vl_mmproj(path: str | Path, seed: int = 0, text_hidden: int = 64, hidden: int = 32,
                               ffn: int = 48, layers: int = 4, heads: int = 2, patch_size: int = 14,
                               n_wa_pattern: int = 2, image_size: int = 56, qwen2: bool = False) -> Path:
    """A random Qwen2.5-VL mmproj (qwen2.5vl_merger, SiLU SwiGLU MLP, RMSNorm, window attention with every
    n_wa_pattern-th layer full) at `path`; output width `text_hidden`. `qwen2`: a Qwen2-VL one instead
    (qwen2vl_merger: LayerNorm with biases, quick-GELU MLP without a gate, no windows)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    normal, gain = _tools(np.random.default_rng(seed))
    w = gguf.GGUFWriter(str(path), "clip")
    projector = gguf.VisionProjectorType.QWEN2VL if qwen2 else gguf.VisionProjectorType.QWEN25VL
    name = "tiny-qwen2vl-mmproj" if qwen2 else "tiny-qwen2.5vl-mmproj"
    mmproj_header(w, name, projector, text_hidden=text_hidden, hidden=hidden, ffn=ffn, layers=layers, heads=heads,
                  image_size=image_size, patch_size=patch_size)
    if not qwen2:
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(n_wa_pattern)

    def norm(name: str) -> None:
        w.add_tensor(name + ".weight", gain(hidden))
        if qwen2:
            w.add_tensor(name + ".bias", normal(hidden, std=0.05))

    w.add_tensor("v.patch_embd.weight", normal(hidden, 3, patch_size, patch_size, std=0.05))
    w.add_tensor("v.patch_embd.weight.1", normal(hidden, 3, patch_size, patch_size, std=0.05))
    for i in range(layers):
        p = f"v.blk.{i}."
        norm(p + "ln1")
        norm(p + "ln2")
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(p + name + ".weight", normal(hidden, hidden, std=0.25))
            w.add_tensor(p + name + ".bias", normal(hidden, std=0.05))
        for name in ("ffn_up",) if qwen2 else ("ffn_gate", "ffn_up"):
            w.add_tensor(p + name + ".weight", normal(ffn, hidden, std=0.2))
            w.add_tensor(p + name + ".bias", normal(ffn, std=0.05))
        w.add_tensor(p + "ffn_down.weight", normal(hidden, ffn, std=0.2))
        w.add_tensor(p + "ffn_down.bias", normal(hidden, std=0.05))
    norm("v.post_ln")
    w.add_tensor("mm.0.weight", normal(4 * hidden, 4 * hidden, std=0.1))
    w.add_tensor("mm.0.bias", normal(4 * hidden, std=0.05))
    w.add_tensor("mm.2.weight", normal(text_hidden, 4 * hidden, std=0.1))
    w.add_tensor("mm.2.bias", normal(text_hidden, std=0.05))
    _close(w)
    return path


def write_tiny_qwen2vl_mmproj(path: str | Path, seed: int = 0, **kw: int) -> Path:
    """A random Qwen2-VL mmproj (write_tiny_qwen25vl_mmproj with qwen2=True)."""
    return write_tiny_qwen25vl_mmproj(path, seed, qwen2=True, **kw)


def write_tiny_qwen3vl_mmproj(path: str | Path, seed: int = 0, text_hidden: int = 64, hidden: int = 32,
                              ffn: int = 48, layers: int = 4, heads: int = 2, patch_size: int = 16,
                              image_size: int = 64, deepstack: tuple[int, ...] = (1, 2)) -> Path:
    """A random Qwen3-VL mmproj (qwen3vl_merger, GELU MLP, LayerNorm, learned positions for an
    image_size^2 grid, DeepStack mergers after the layers in `deepstack`) at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    normal, gain = _tools(np.random.default_rng(seed))
    w = gguf.GGUFWriter(str(path), "clip")
    mmproj_header(w, "tiny-qwen3vl-mmproj", gguf.VisionProjectorType.QWEN3VL, text_hidden=text_hidden, hidden=hidden,
                  ffn=ffn, layers=layers, heads=heads, image_size=image_size, patch_size=patch_size)
    w.add_vision_use_gelu(True)
    w.add_vision_spatial_merge_size(2)
    w.add_vision_is_deepstack_layers([i in deepstack for i in range(layers)])

    def ln(prefix: str, n: int) -> None:
        w.add_tensor(prefix + ".weight", gain(n))
        w.add_tensor(prefix + ".bias", normal(n, std=0.05))

    side = image_size // patch_size
    w.add_tensor("v.patch_embd.weight", normal(hidden, 3, patch_size, patch_size, std=0.05))
    w.add_tensor("v.patch_embd.weight.1", normal(hidden, 3, patch_size, patch_size, std=0.05))
    w.add_tensor("v.patch_embd.bias", normal(hidden, std=0.05))
    w.add_tensor("v.position_embd.weight", normal(side * side, hidden, std=0.3))
    for i in range(layers):
        p = f"v.blk.{i}."
        ln(p + "ln1", hidden)
        ln(p + "ln2", hidden)
        w.add_tensor(p + "attn_qkv.weight", normal(3 * hidden, hidden, std=0.25))
        w.add_tensor(p + "attn_qkv.bias", normal(3 * hidden, std=0.05))
        w.add_tensor(p + "attn_out.weight", normal(hidden, hidden, std=0.25))
        w.add_tensor(p + "attn_out.bias", normal(hidden, std=0.05))
        w.add_tensor(p + "ffn_up.weight", normal(ffn, hidden, std=0.2))
        w.add_tensor(p + "ffn_up.bias", normal(ffn, std=0.05))
        w.add_tensor(p + "ffn_down.weight", normal(hidden, ffn, std=0.2))
        w.add_tensor(p + "ffn_down.bias", normal(hidden, std=0.05))
    for i in deepstack:
        p = f"v.deepstack.{i}."
        ln(p + "norm", 4 * hidden)
        w.add_tensor(p + "fc1.weight", normal(4 * hidden, 4 * hidden, std=0.1))
        w.add_tensor(p + "fc1.bias", normal(4 * hidden, std=0.05))
        w.add_tensor(p + "fc2.weight", normal(text_hidden, 4 * hidden, std=0.1))
        w.add_tensor(p + "fc2.bias", normal(text_hidden, std=0.05))
    ln("v.post_ln", hidden)
    w.add_tensor("mm.0.weight", normal(4 * hidden, 4 * hidden, std=0.1))
    w.add_tensor("mm.0.bias", normal(4 * hidden, std=0.05))
    w.add_tensor("mm.2.weight", normal(text_hidden, 4 * hidden, std=0.1))
    w.add_tensor("mm.2.bias", normal(text_hidden, std=0.05))
    _close(w)
    return path


def write_tiny_qwen_vl_text(path: str | Path, arch: str, seed: int = 0, hidden: int = 64, layers: int = 4,
                            heads: int = 4, kv_heads: int = 2, ffn: int = 128, deepstack: int = 2,
                            context_length: int = 512) -> Path:
    """A random Qwen-VL text model: arch "qwen2vl" (Qwen2: Q/K/V biases, head 16, M-RoPE sections
    [2, 3, 3, 0]), "qwen3vl" (Qwen3: QK-norm, head 32, interleaved M-RoPE sections [6, 5, 5, 0],
    n_deepstack_layers `deepstack`) or "qwen3vlmoe" (qwen3vl with 8 experts of 64, top-2, in every layer);
    untied output, rope base 1e6, rms eps 1e-6."""
    if arch not in ("qwen2vl", "qwen3vl", "qwen3vlmoe"):
        raise ValueError(f"unknown Qwen-VL text arch {arch!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    normal, gain = _tools(np.random.default_rng(seed))
    head_dim, sections = (16, [2, 3, 3, 0]) if arch == "qwen2vl" else (32, [6, 5, 5, 0])
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    add_shape(w, layers, context_length, hidden, ffn, heads, kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_sections(sections)
    if arch == "qwen3vlmoe":
        w.add_expert_count(8)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(64)
    if arch != "qwen2vl":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_uint32(f"{arch}.n_deepstack_layers", deepstack)
    vocab = add_tokenizer(w)
    w.add_tensor("token_embd.weight", normal(vocab, hidden, std=0.5))
    w.add_tensor("output_norm.weight", gain(hidden))
    w.add_tensor("output.weight", normal(vocab, hidden, std=0.3))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", gain(hidden))
        w.add_tensor(p + "ffn_norm.weight", gain(hidden))
        w.add_tensor(p + "attn_q.weight", normal(heads * head_dim, hidden, std=0.15))
        w.add_tensor(p + "attn_k.weight", normal(kv_heads * head_dim, hidden, std=0.15))
        w.add_tensor(p + "attn_v.weight", normal(kv_heads * head_dim, hidden, std=0.1))
        if arch == "qwen2vl":
            w.add_tensor(p + "attn_q.bias", normal(heads * head_dim, std=0.1))
            w.add_tensor(p + "attn_k.bias", normal(kv_heads * head_dim, std=0.1))
            w.add_tensor(p + "attn_v.bias", normal(kv_heads * head_dim, std=0.1))
        else:
            w.add_tensor(p + "attn_q_norm.weight", gain(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", gain(head_dim))
        w.add_tensor(p + "attn_output.weight", normal(hidden, heads * head_dim, std=0.1))
        if arch == "qwen3vlmoe":
            w.add_tensor(p + "ffn_gate_inp.weight", normal(8, hidden, std=0.3))
            w.add_tensor(p + "ffn_gate_exps.weight", normal(8, 64, hidden, std=0.15))
            w.add_tensor(p + "ffn_up_exps.weight", normal(8, 64, hidden, std=0.15))
            w.add_tensor(p + "ffn_down_exps.weight", normal(8, hidden, 64, std=0.1))
            continue
        w.add_tensor(p + "ffn_gate.weight", normal(ffn, hidden, std=0.1))
        w.add_tensor(p + "ffn_up.weight", normal(ffn, hidden, std=0.1))
        w.add_tensor(p + "ffn_down.weight", normal(hidden, ffn, std=0.1))
    _close(w)
    return path
