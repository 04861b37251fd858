"""Tiny random GGUFs of the hybrid families (attention beside recurrent layers), laid out as llama.cpp's
convert_hf_to_gguf.py writes them (tests only): llama.cpp's tensor names and metadata keys, the shapes its
loaders create. `write_tiny_hybrid(path, family)` writes one; scripts/make_hybrid_goldens.py runs llama.cpp
on them (tests/goldens/families/<family>.npz). Built on tiny_families' _Writer (the tokenizer, the random
tensors, `quant` for the layers' projection matrices); norms, convolution taps, A, D and biases stay F32.

Each family registers its writer in HYBRIDS: family name -> (general.architecture, writer). Common: hidden
64, 4 query heads of 16, 2 KV heads, ffn 128, the 310-token tiny vocabulary, 4+ layers mixing both kinds.

- lfm2 (lfm2): 4 layers [conv, attention, conv, attention] from attention.head_count_kv [0, 2, 0, 2];
  shortconv.l_cache 3; shortconv.in_proj [192, 64], shortconv.conv [64, 3], shortconv.out_proj [64, 64];
  attention with attn_q_norm / attn_k_norm [16], NEOX RoPE (base 1e6, not permuted); SwiGLU FFN in every
  layer; the output norm stored as token_embd_norm; tied head.
- lfm2moe (lfm2moe): lfm2's mixers, leading_dense_block_count 1 (layer 0 dense), layers 1-3 with 8
  experts of expert_feed_forward_length 32, top-2, expert_gating_func 2 (sigmoid), exp_probs_b.bias [8];
  untied output.weight.
- granitehybrid (granitehybrid): 4 layers [mamba2, attention, mamba2, attention] from head_count_kv
  [0, 2, 0, 2]; Mamba2: ssm.conv_kernel 4, ssm.inner_size 128 (2 x hidden), ssm.state_size 16,
  ssm.time_step_rank 8 (heads of 16), ssm.group_count 2; ssm_in [328, 64] (z 128 | xBC 192 | dt 8),
  ssm_conv1d [192, 4] + bias, ssm_dt.bias [8], ssm_a [8, 1] = -exp(A_log), ssm_d [8, 1],
  ssm_norm [2, 64], ssm_out [64, 128]; attention without RoPE (rope.scaling.finetuned false, as the
  converter writes for a hybrid), Granite's multipliers (embedding 1.5, residual 0.5, attention 0.1,
  logit scale 1.25); SwiGLU FFN in every layer; tied.
- granitehybrid_moe (granitehybrid): as granitehybrid with 8 experts (top-2, width feed_forward_length
  64, softmax routing) plus a shared SwiGLU expert of expert_shared_feed_forward_length 96.
- granitehybrid_rope (granitehybrid): as granitehybrid with rope.scaling.finetuned true (Bamba's): NORM RoPE
  (base 1e4) on the attention layers, whose attn_q / attn_k the converter permuted.
- nemotron_h (nemotron_h): 6 layers [mamba2, ffn, attention, ffn, mamba2, ffn] from head_count_kv
  [0, 0, 2, 0, 0, 0] and feed_forward_length [0, 128, 0, 128, 0, 128]; Mamba2 as granitehybrid's;
  attention without RoPE, key_length 16; the FFN layers squared-ReLU, ungated (ffn_up, ffn_down); each
  layer's only norm attn_norm; untied.
- nemotron_h_moe (nemotron_h_moe): nemotron_h's layers with the FFN layers a mixture of 8 ungated
  squared-ReLU experts (ffn_up_exps / ffn_down_exps, expert_feed_forward_length 32, also the
  feed_forward_length entries), top-2 by sigmoid + exp_probs_b.bias, expert_weights_norm true,
  expert_weights_scale 2.5, expert_group_count 1, plus a shared ungated expert (ffn_up_shexp /
  ffn_down_shexp, expert_shared_feed_forward_length 48).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_families import (
    FFN,
    GRANITE,
    HEADS,
    HIDDEN,
    KV_HEADS,
    _attention,
    _gated_ffn,
    _Writer,
)
from hitenter.testing.tiny_model import add_weight
from hitenter.testing.tiny_qwen35 import QWEN35_HYBRIDS

HEAD_DIM = HIDDEN // HEADS
# Mamba2 shapes shared by granitehybrid and nemotron_h
SSM = {"conv": 4, "inner": 2 * HIDDEN, "state": 16, "heads": 8, "groups": 2}
LFM2_L_CACHE = 3


def _f32(f: _Writer, name: str, arr: np.ndarray) -> None:
    """A tensor kept F32 whatever `quant` (norms, taps, A, D: llama.cpp's quantize leaves them)."""
    add_weight(f.w, name, arr, None, f.rng)


def _hparams(f: _Writer, layers: int, context: int, kv_heads: list[int], ffn: int | list[int]) -> None:
    """The common keys, head_count_kv (and feed_forward_length where given so) as per-layer arrays."""
    w = f.w
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(ffn)
    w.add_head_count(HEADS)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)


def _short_conv(f: _Writer, p: str) -> None:
    f.add(p + "shortconv.in_proj.weight", f.normal(3 * HIDDEN, HIDDEN, std=0.15))
    _f32(f, p + "shortconv.conv.weight", f.normal(HIDDEN, LFM2_L_CACHE, std=0.5))
    f.add(p + "shortconv.out_proj.weight", f.normal(HIDDEN, HIDDEN, std=0.1))


def _lfm2(f: _Writer, moe: bool) -> None:
    layers, kinds = 4, ["conv", "attention", "conv", "attention"]
    n_expert, n_ff_exp = 8, 32
    _hparams(f, layers, 4096, [0 if k == "conv" else KV_HEADS for k in kinds], FFN)
    f.w.add_rope_freq_base(1e6)
    f.w.add_shortconv_l_cache(LFM2_L_CACHE)
    if moe:
        f.w.add_expert_count(n_expert)
        f.w.add_expert_used_count(2)
        f.w.add_expert_feed_forward_length(n_ff_exp)
        f.w.add_leading_dense_block_count(1)
        f.w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    vocab = f.finish_metadata()
    f.w.add_vocab_size(vocab)
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.5))
    _f32(f, "token_embd_norm.weight", f.norm(HIDDEN))
    if moe:
        f.add("output.weight", f.normal(vocab, HIDDEN, std=0.3))
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        _f32(f, p + "attn_norm.weight", f.norm(HIDDEN))
        if kind == "conv":
            _short_conv(f, p)
        else:
            _attention(f, p, HEAD_DIM, permute=False, q_std=0.2)
            _f32(f, p + "attn_q_norm.weight", f.norm(HEAD_DIM))
            _f32(f, p + "attn_k_norm.weight", f.norm(HEAD_DIM))
        _f32(f, p + "ffn_norm.weight", f.norm(HIDDEN))
        if moe and i >= 1:
            f.add(p + "ffn_gate_inp.weight", f.normal(n_expert, HIDDEN, std=0.3))
            f.add(p + "ffn_gate_exps.weight", f.normal(n_expert, n_ff_exp, HIDDEN, std=0.15))
            f.add(p + "ffn_up_exps.weight", f.normal(n_expert, n_ff_exp, HIDDEN, std=0.15))
            f.add(p + "ffn_down_exps.weight", f.normal(n_expert, HIDDEN, n_ff_exp, std=0.15))
            _f32(f, p + "exp_probs_b.bias", f.normal(n_expert, std=0.3))
        else:
            _gated_ffn(f, p)


def _ssm_metadata(f: _Writer) -> None:
    w = f.w
    w.add_ssm_conv_kernel(SSM["conv"])
    w.add_ssm_state_size(SSM["state"])
    w.add_ssm_group_count(SSM["groups"])
    w.add_ssm_inner_size(SSM["inner"])
    w.add_ssm_time_step_rank(SSM["heads"])


def _mamba2(f: _Writer, p: str) -> None:
    """A Mamba2 mixer as convert's Mamba2Model writes it (ssm_a = -exp(A_log), A and D as [heads, 1],
    ssm_norm as [groups, inner / groups])."""
    inner, ds, nh, ng, k = SSM["inner"], SSM["state"], SSM["heads"], SSM["groups"], SSM["conv"]
    channels = inner + 2 * ng * ds
    f.add(p + "ssm_in.weight", f.normal(2 * inner + 2 * ng * ds + nh, HIDDEN, std=0.2))
    _f32(f, p + "ssm_conv1d.weight", f.normal(channels, k, std=0.5))
    _f32(f, p + "ssm_conv1d.bias", f.normal(channels, std=0.2))
    _f32(f, p + "ssm_dt.bias", f.normal(nh, std=0.5))
    a_log = np.log(f.rng.uniform(1.0, 8.0, nh)).astype(np.float32)   # HF's A_log init range
    _f32(f, p + "ssm_a", (-np.exp(a_log)).reshape(nh, 1).astype(np.float32))
    _f32(f, p + "ssm_d", (1.0 + f.normal(nh, std=0.3)).reshape(nh, 1))
    _f32(f, p + "ssm_norm.weight", f.norm(inner).reshape(ng, inner // ng))
    f.add(p + "ssm_out.weight", f.normal(HIDDEN, inner, std=0.1))


def _granitehybrid(f: _Writer, moe: bool, rope: bool = False) -> None:
    kinds = ["mamba2", "attention", "mamba2", "attention"]
    n_expert, n_ff, n_ff_shexp = 8, 64, 96
    _hparams(f, len(kinds), 2 ** 20, [0 if k == "mamba2" else KV_HEADS for k in kinds], n_ff if moe else FFN)
    f.w.add_rope_freq_base(1e4)
    f.w.add_rope_scaling_finetuned(rope)
    if moe:
        f.w.add_expert_count(n_expert)
        f.w.add_expert_used_count(2)
        f.w.add_expert_shared_feed_forward_length(n_ff_shexp)
    _ssm_metadata(f)
    vocab = f.finish_metadata()
    f.w.add_vocab_size(vocab)
    f.w.add_attention_scale(GRANITE["attention_scale"])
    f.w.add_embedding_scale(GRANITE["embedding_scale"])
    f.w.add_residual_scale(GRANITE["residual_scale"])
    f.w.add_logit_scale(GRANITE["logit_scale"])
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.4))
    _f32(f, "output_norm.weight", f.norm(HIDDEN))
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        _f32(f, p + "attn_norm.weight", f.norm(HIDDEN))
        if kind == "mamba2":
            _mamba2(f, p)
        else:
            _attention(f, p, HEAD_DIM, permute=True)
        _f32(f, p + "ffn_norm.weight", f.norm(HIDDEN))
        if moe:
            f.add(p + "ffn_gate_inp.weight", f.normal(n_expert, HIDDEN, std=0.3))
            f.add(p + "ffn_gate_exps.weight", f.normal(n_expert, n_ff, HIDDEN, std=0.15))
            f.add(p + "ffn_up_exps.weight", f.normal(n_expert, n_ff, HIDDEN, std=0.15))
            f.add(p + "ffn_down_exps.weight", f.normal(n_expert, HIDDEN, n_ff, std=0.15))
            f.add(p + "ffn_gate_shexp.weight", f.normal(n_ff_shexp, HIDDEN, std=0.15))
            f.add(p + "ffn_up_shexp.weight", f.normal(n_ff_shexp, HIDDEN, std=0.15))
            f.add(p + "ffn_down_shexp.weight", f.normal(HIDDEN, n_ff_shexp, std=0.1))
        else:
            _gated_ffn(f, p)


def _nemotron_h(f: _Writer, moe: bool = False) -> None:
    kinds = ["mamba2", "ffn", "attention", "ffn", "mamba2", "ffn"]
    n_expert, n_ff_exp, n_ff_shexp = 8, 32, 48
    _hparams(f, len(kinds), 8192, [KV_HEADS if k == "attention" else 0 for k in kinds],
             [(n_ff_exp if moe else FFN) if k == "ffn" else 0 for k in kinds])
    f.w.add_key_length(HEAD_DIM)
    f.w.add_value_length(HEAD_DIM)
    f.w.add_layer_norm_eps(1e-5)   # convert's TextModel writes it from layer_norm_epsilon; llama.cpp requires it
    if moe:   # as convert's NemotronHModel writes a MoE config
        f.w.add_expert_used_count(2)
        f.w.add_expert_feed_forward_length(n_ff_exp)
        f.w.add_expert_shared_feed_forward_length(n_ff_shexp)
        f.w.add_expert_count(n_expert)
        f.w.add_expert_shared_count(1)
        f.w.add_expert_weights_norm(True)
        f.w.add_expert_weights_scale(2.5)
        f.w.add_expert_group_count(1)
    _ssm_metadata(f)
    vocab = f.finish_metadata()
    f.w.add_vocab_size(vocab)
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.5))
    _f32(f, "output_norm.weight", f.norm(HIDDEN))
    f.add("output.weight", f.normal(vocab, HIDDEN, std=0.3))
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        _f32(f, p + "attn_norm.weight", f.norm(HIDDEN))
        if kind == "mamba2":
            _mamba2(f, p)
        elif kind == "attention":
            _attention(f, p, HEAD_DIM, permute=False)
        elif moe:
            f.add(p + "ffn_gate_inp.weight", f.normal(n_expert, HIDDEN, std=0.3))
            _f32(f, p + "exp_probs_b.bias", f.normal(n_expert, std=0.3))
            f.add(p + "ffn_up_exps.weight", f.normal(n_expert, n_ff_exp, HIDDEN, std=0.2))
            f.add(p + "ffn_down_exps.weight", f.normal(n_expert, HIDDEN, n_ff_exp, std=0.1))
            f.add(p + "ffn_up_shexp.weight", f.normal(n_ff_shexp, HIDDEN, std=0.2))
            f.add(p + "ffn_down_shexp.weight", f.normal(HIDDEN, n_ff_shexp, std=0.1))
        else:
            f.add(p + "ffn_up.weight", f.normal(FFN, HIDDEN, std=0.2))
            f.add(p + "ffn_down.weight", f.normal(HIDDEN, FFN, std=0.1))


HYBRIDS: dict[str, tuple[str, Callable[[_Writer], None]]] = {
    "lfm2": ("lfm2", lambda f: _lfm2(f, moe=False)),
    "lfm2moe": ("lfm2moe", lambda f: _lfm2(f, moe=True)),
    "granitehybrid": ("granitehybrid", lambda f: _granitehybrid(f, moe=False)),
    "granitehybrid_moe": ("granitehybrid", lambda f: _granitehybrid(f, moe=True)),
    "granitehybrid_rope": ("granitehybrid", lambda f: _granitehybrid(f, moe=False, rope=True)),
    "nemotron_h": ("nemotron_h", _nemotron_h),
    "nemotron_h_moe": ("nemotron_h_moe", lambda f: _nemotron_h(f, moe=True)),
    **QWEN35_HYBRIDS,   # qwen35, qwen35moe, qwen3next (tiny_qwen35.py)
}


def write_tiny_hybrid(path: str | Path, family: str, seed: int = 0, quant: str | None = None) -> Path:
    """Write the tiny random hybrid `family` (a key of HYBRIDS) to `path`; return it. The same arguments always
    give the same bytes. quant: None (all F32) or a GGML type name for the layers' projection matrices."""
    if family not in HYBRIDS:
        raise ValueError(f"unknown hybrid family {family!r}; families: {', '.join(HYBRIDS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arch, write = HYBRIDS[family]
    f = _Writer(path, arch, family, seed, quant)
    write(f)
    f.close()
    return path
