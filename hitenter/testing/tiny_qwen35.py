"""Tiny random GGUFs of the Qwen3.5 / Qwen3-Next hybrids (tests only), laid out as convert_hf_to_gguf.py
writes them (conversion/qwen.py: Qwen3_5TextModel, Qwen3_5MoeTextModel, Qwen3NextModel) with llama.cpp's
tensor names and metadata keys; registered in tiny_hybrids.HYBRIDS (written by `write_tiny_hybrid`,
goldens by scripts/make_hybrid_goldens.py). Norms, conv taps, ssm_a, ssm_dt and the shared-expert gate
stay F32 whatever `quant`; the layers' other matrices follow it.

Common: hidden 64, the tiny 310-token vocabulary, rms eps 1e-6, context 4096.
Attention layers (gated): 4 query heads, 2 KV heads, key_length = value_length 32; attn_q [256, 64] =
per head 32 query rows then 32 gate rows; attn_k / attn_v [64, 64]; attn_output [64, 128];
attn_q_norm / attn_k_norm [32].
Gated DeltaNet layers: ssm.group_count 2 key heads, ssm.time_step_rank 4 value heads, ssm.state_size 16
(= value head size), ssm.inner_size 64, ssm.conv_kernel 4; attn_qkv [128, 64] (q 32 | k 32 | v 64),
attn_gate [64, 64], ssm_conv1d [128, 4], ssm_dt.bias [4], ssm_a [4] = -exp(A_log) (here in -1 .. -0.1,
with dt.bias ~ N(-0.5, 0.5), so a state keeps ~10 tokens), ssm_beta / ssm_alpha [4, 64], ssm_norm [16],
ssm_out [64, 64]. Every layer: attn_norm, post_attention_norm (the FFN's input norm).

- qwen35 (qwen35): block_count 5 with nextn_predict_layers 1: trunk layers 0-2 Gated DeltaNet, 3 attention
  (full_attention_interval 4), and blk.4 an MTP block (attention + FFN tensors, nextn.eh_proj [64, 128],
  nextn.enorm / hnorm / shared_head_norm [64]) that the main forward pass never runs; SwiGLU FFN 128;
  rope.freq_base 1e7, rope.dimension_count 16 (the first 16 of 32 dims), rope.dimension_sections
  [3, 3, 2, 0] (every rotated pair on a text axis); tied.
- qwen35_wide (qwen35): qwen35's trunk (no MTP) with real Qwen3.5 head sizes: attention head_dim 256,
  rope.dimension_count 64, sections [11, 11, 10, 0]; Gated DeltaNet 8 key heads, 16 value heads, state 128
  (attn_qkv [4096, 64], attn_gate [2048, 64], ssm_out [64, 2048]).
- qwen35moe (qwen35moe): 4 layers as qwen35's trunk, no MTP, untied; in every layer 8 experts of
  expert_feed_forward_length 32, top-2 (expert_used_count), and the shared expert
  (expert_shared_feed_forward_length 48): ffn_gate_inp [8, 64], ffn_{gate,up}_exps [8, 32, 64],
  ffn_down_exps [8, 64, 32], ffn_{gate,up}_shexp [48, 64], ffn_down_shexp [64, 48],
  ffn_gate_inp_shexp [64]. No feed_forward_length key.
- qwen35moe_mtp (qwen35moe, in MTP_HYBRIDS only, not HYBRIDS): qwen35moe's layout (random weights of its
  own) with block_count 5, nextn_predict_layers 1 and blk.4 an MTP block whose FFN is the trunk's experts
  plus shared expert (llama.cpp's qwen35moe load_block_mtp). qwen35_copy / qwen35moe_copy (MTP_HYBRIDS):
  qwen35 / qwen35moe_mtp whose MTP block drafts exactly what the trunk predicts (_copying).
- qwen35moe_gate_up (qwen35moe): qwen35moe's layout (random weights of its own) with each layer's gate and up
  experts merged as llama.cpp also loads them: ffn_gate_up_exps [8, 64, 64] = per expert 32 gate rows then
  32 up rows.
- qwen3next (qwen3next): 4 layers from attention.recurrent_layers [true, false, true, false] (the array
  wins over the full_attention_interval 4 also written); plain NEOX RoPE, rope.dimension_count 8,
  base 1e7, no sections; value heads grouped by key head (not reordered by the converter); beta and
  alpha fused: ssm_ba [8, 64] = per key head [beta 2 | alpha 2]; MoE as qwen35moe, feed_forward_length
  written; untied.
- qwen3next_ssm_in (qwen3next): qwen3next's layout (random weights of its own) with q, k, v, z fused the
  older converters' way: ssm_in [192, 64] = per key head [q 16 | k 16 | v 32 | z 32] instead of attn_qkv /
  attn_gate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hitenter.testing.tiny_families import HEADS, HIDDEN, KV_HEADS, _Writer
from hitenter.testing.tiny_model import add_weight

FFN, N_EXPERT, EXPERT_FFN, SHARED_FFN = 128, 8, 32, 48


@dataclass(frozen=True)
class Shape:
    """The head sizes of one tiny file: attention head_dim, rotated dims, IMROPE sections; Gated DeltaNet key
    heads, value heads, state (= key = value head) size, conv taps."""

    head_dim: int = 32
    rope_dim: int = 16
    sections: tuple[int, ...] = (3, 3, 2, 0)
    key_heads: int = 2
    value_heads: int = 4
    state: int = 16
    conv: int = 4

    @property
    def inner(self) -> int:
        return self.value_heads * self.state


TINY = Shape()
NEXT = Shape(rope_dim=8)
WIDE = Shape(head_dim=256, rope_dim=64, sections=(11, 11, 10, 0), key_heads=8, value_heads=16, state=128)


def _f32(f: _Writer, name: str, arr: np.ndarray) -> None:
    edit = getattr(f, "edit", None)   # _copying's
    add_weight(f.w, name, arr if edit is None else edit(name, arr), None, f.rng)


def _metadata(f: _Writer, s: Shape, layers: int, moe: bool, next_rope: bool) -> None:
    w = f.w
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    if not (moe and not next_rope):    # qwen35moe's converter writes no dense FFN width
        w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(s.rope_dim)
    if not next_rope:
        w.add_rope_dimension_sections(list(s.sections))
    w.add_ssm_conv_kernel(s.conv)
    w.add_ssm_state_size(s.state)
    w.add_ssm_group_count(s.key_heads)
    w.add_ssm_time_step_rank(s.value_heads)
    w.add_ssm_inner_size(s.inner)
    w.add_full_attention_interval(4)
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(EXPERT_FFN)
        w.add_expert_shared_feed_forward_length(SHARED_FFN)


def _attention(f: _Writer, p: str, s: Shape) -> None:
    f.add(p + "attn_q.weight", f.normal(2 * HEADS * s.head_dim, HIDDEN, std=0.2))
    f.add(p + "attn_k.weight", f.normal(KV_HEADS * s.head_dim, HIDDEN, std=0.2))
    f.add(p + "attn_v.weight", f.normal(KV_HEADS * s.head_dim, HIDDEN, std=0.2))
    f.add(p + "attn_output.weight", f.normal(HIDDEN, HEADS * s.head_dim, std=0.1))
    _f32(f, p + "attn_q_norm.weight", f.norm(s.head_dim))
    _f32(f, p + "attn_k_norm.weight", f.norm(s.head_dim))


def _gated_deltanet(f: _Writer, p: str, layout: str, s: Shape) -> None:
    """layout "qwen35" (attn_qkv, attn_gate, ssm_beta, ssm_alpha), "qwen3next" (ssm_ba fused per key head)
    or "ssm_in" (ssm_ba, and q, k, v, z fused per key head in ssm_in)."""
    hk, hv, ds, inner = s.key_heads, s.value_heads, s.state, s.inner
    r, channels = hv // hk, 2 * hk * ds + inner
    # k's rows and taps near q's (cosine ~0.9): random q, k of 16 dims are often near orthogonal, and where
    # q . k ~ 0 the gated norm of a one-term output flips sign under any rounding (an ill-conditioned test)
    q = f.normal(hk * ds, HIDDEN, std=0.2)
    qkv = np.concatenate([q, q + f.normal(hk * ds, HIDDEN, std=0.1), f.normal(inner, HIDDEN, std=0.2)])
    z = f.normal(inner, HIDDEN, std=0.2)
    if layout == "ssm_in":
        q, k, v = np.split(qkv, [hk * ds, 2 * hk * ds])
        groups = [np.concatenate([q[g * ds:(g + 1) * ds], k[g * ds:(g + 1) * ds], v[g * r * ds:(g + 1) * r * ds],
                                  z[g * r * ds:(g + 1) * r * ds]]) for g in range(hk)]
        f.add(p + "ssm_in.weight", np.concatenate(groups))
    else:
        f.add(p + "attn_qkv.weight", qkv)
        f.add(p + "attn_gate.weight", z)
    taps = f.normal(channels, s.conv, std=0.5)
    taps[hk * ds:2 * hk * ds] = taps[:hk * ds] + f.normal(hk * ds, s.conv, std=0.2)
    _f32(f, p + "ssm_conv1d.weight", taps)
    _f32(f, p + "ssm_dt.bias", (f.normal(hv, std=0.5) - 0.5).astype(np.float32))
    _f32(f, p + "ssm_a", (-f.rng.uniform(0.02, 0.3, hv)).astype(np.float32))
    beta, alpha = f.normal(hv, HIDDEN, std=0.2), f.normal(hv, HIDDEN, std=0.2)
    if layout == "qwen35":
        f.add(p + "ssm_beta.weight", beta)
        f.add(p + "ssm_alpha.weight", alpha)
    else:
        f.add(p + "ssm_ba.weight", np.concatenate([np.concatenate([beta[g * r:(g + 1) * r], alpha[g * r:(g + 1) * r]])
                                                   for g in range(hk)]))
    _f32(f, p + "ssm_norm.weight", f.norm(ds))
    f.add(p + "ssm_out.weight", f.normal(HIDDEN, inner, std=0.1))


def _ffn(f: _Writer, p: str, moe: bool, merged: bool = False) -> None:
    if not moe:
        f.add(p + "ffn_gate.weight", f.normal(FFN, HIDDEN, std=0.15))
        f.add(p + "ffn_up.weight", f.normal(FFN, HIDDEN, std=0.15))
        f.add(p + "ffn_down.weight", f.normal(HIDDEN, FFN, std=0.1))
        return
    f.add(p + "ffn_gate_inp.weight", f.normal(N_EXPERT, HIDDEN, std=0.3))
    gate, up = f.normal(N_EXPERT, EXPERT_FFN, HIDDEN, std=0.15), f.normal(N_EXPERT, EXPERT_FFN, HIDDEN, std=0.15)
    if merged:
        f.add(p + "ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1))
    else:
        f.add(p + "ffn_gate_exps.weight", gate)
        f.add(p + "ffn_up_exps.weight", up)
    f.add(p + "ffn_down_exps.weight", f.normal(N_EXPERT, HIDDEN, EXPERT_FFN, std=0.15))
    f.add(p + "ffn_gate_shexp.weight", f.normal(SHARED_FFN, HIDDEN, std=0.15))
    f.add(p + "ffn_up_shexp.weight", f.normal(SHARED_FFN, HIDDEN, std=0.15))
    f.add(p + "ffn_down_shexp.weight", f.normal(HIDDEN, SHARED_FFN, std=0.1))
    _f32(f, p + "ffn_gate_inp_shexp.weight", f.normal(HIDDEN, std=0.3))


def _mtp(f: _Writer, p: str, s: Shape, moe: bool = False) -> None:
    """An MTP block (convert's _QwenMtpMixin): a full-attention layer plus the nextn tensors (the FFN the
    trunk's: experts + shared expert in a qwen35moe file)."""
    _f32(f, p + "attn_norm.weight", f.norm(HIDDEN))
    _f32(f, p + "post_attention_norm.weight", f.norm(HIDDEN))
    _attention(f, p, s)
    _ffn(f, p, moe=moe)
    f.add(p + "nextn.eh_proj.weight", f.normal(HIDDEN, 2 * HIDDEN, std=0.1))
    for name in ("enorm", "hnorm", "shared_head_norm"):
        _f32(f, p + f"nextn.{name}.weight", f.norm(HIDDEN))


def _write(f: _Writer, family: str, mtp: bool | None = None) -> None:
    """`mtp`: append an MTP block (default: qwen35 only)."""
    moe = family not in ("qwen35", "qwen35_wide")
    nxt = family.startswith("qwen3next")
    kinds = ["gdn", "attention", "gdn", "attention"] if nxt else ["gdn", "gdn", "gdn", "attention"]
    mtp = family == "qwen35" if mtp is None else mtp
    s = WIDE if family == "qwen35_wide" else NEXT if nxt else TINY
    _metadata(f, s, len(kinds) + mtp, moe, nxt)
    if mtp:
        f.w.add_nextn_predict_layers(1)
    if nxt:
        f.w.add_array(f"{f.arch}.attention.recurrent_layers", [k == "gdn" for k in kinds])
    vocab = f.finish_metadata()
    f.w.add_vocab_size(vocab)
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.5))
    _f32(f, "output_norm.weight", f.norm(HIDDEN))
    if moe:
        f.add("output.weight", f.normal(vocab, HIDDEN, std=0.3))
    layout = "ssm_in" if family == "qwen3next_ssm_in" else "qwen3next" if nxt else "qwen35"
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        _f32(f, p + "attn_norm.weight", f.norm(HIDDEN))
        if kind == "gdn":
            _gated_deltanet(f, p, layout, s)
        else:
            _attention(f, p, s)
        _f32(f, p + "post_attention_norm.weight", f.norm(HIDDEN))
        _ffn(f, p, moe, merged=family == "qwen35moe_gate_up")
    if mtp:
        _mtp(f, f"blk.{len(kinds)}.", s, moe)


QWEN35_HYBRIDS: dict[str, tuple[str, Callable[[_Writer], None]]] = {
    "qwen35": ("qwen35", lambda f: _write(f, "qwen35")),
    "qwen35_wide": ("qwen35", lambda f: _write(f, "qwen35_wide")),
    "qwen35moe": ("qwen35moe", lambda f: _write(f, "qwen35moe")),
    "qwen35moe_gate_up": ("qwen35moe", lambda f: _write(f, "qwen35moe_gate_up")),
    "qwen3next": ("qwen3next", lambda f: _write(f, "qwen3next")),
    "qwen3next_ssm_in": ("qwen3next", lambda f: _write(f, "qwen3next_ssm_in")),
}

def _copying(f: _Writer) -> _Writer:
    """`f` writing a file whose MTP block drafts exactly what the trunk will predict: every layer's output
    projections (ssm_out, attn_output, ffn_down and the experts') zero, so the trunk's hidden state at a
    position is output_norm of its token's embedding (a bigram model); the MTP block's eh_proj takes the
    token half only ([I | 0]), its enorm is 1, its attention and FFN add zero and its shared_head_norm is
    output_norm, so its logits for (token, h) are the trunk's for that token. Greedy drafts are then all
    accepted (up to float rounding): a test of the drafter's plumbing."""
    add, kept = f.add, {}

    def edit(name: str, arr: np.ndarray) -> np.ndarray:
        if name.endswith(("ssm_out.weight", "attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight",
                          "ffn_down_shexp.weight")):
            return np.zeros_like(arr)
        if name.endswith("nextn.eh_proj.weight"):
            return np.eye(*arr.shape, dtype=arr.dtype)
        if name.endswith("nextn.enorm.weight"):
            return np.ones_like(arr)
        if name == "output_norm.weight":
            kept[name] = arr
        if name.endswith("nextn.shared_head_norm.weight"):
            return kept["output_norm.weight"]
        return arr

    f.add = lambda name, arr: add(name, edit(name, arr))   # type: ignore[method-assign]
    f.edit = edit   # type: ignore[attr-defined]
    return f


# the files with an MTP block (the speculative MTP drafter's tests: hitenter/models/mtp.py); *_copy: the
# block drafts what the trunk predicts (_copying)
MTP_HYBRIDS: dict[str, tuple[str, Callable[[_Writer], None]]] = {
    "qwen35": QWEN35_HYBRIDS["qwen35"],
    "qwen35moe_mtp": ("qwen35moe", lambda f: _write(f, "qwen35moe", mtp=True)),
    "qwen35_copy": ("qwen35", lambda f: _write(_copying(f), "qwen35")),
    "qwen35moe_copy": ("qwen35moe", lambda f: _write(_copying(f), "qwen35moe", mtp=True)),
}


def write_tiny_mtp(path: str | Path, family: str, seed: int = 0, quant: str | None = None) -> Path:
    """Write the tiny hybrid `family` of MTP_HYBRIDS (one with an MTP block) to `path`; return it."""
    if family not in MTP_HYBRIDS:
        raise ValueError(f"unknown MTP family {family!r}; families: {', '.join(MTP_HYBRIDS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arch, write = MTP_HYBRIDS[family]
    f = _Writer(path, arch, family, seed, quant)
    write(f)
    f.close()
    return path
