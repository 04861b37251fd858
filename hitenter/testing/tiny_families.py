"""Tiny random GGUFs of every model family, laid out exactly as llama.cpp's convert_hf_to_gguf.py writes
them (tests only): llama.cpp's tensor names and metadata keys, Q/K permuted where the converter permutes
them, norms stored as the converter stores them. `write_tiny_family(path, family)` writes one in well under a
second; scripts/make_family_goldens.py runs llama.cpp on them (tests/goldens/families/<family>.npz).

Common to all: tiny_model.py's 310-token GPT-2-style vocabulary (`add_tokenizer`), hidden 64, 4 query heads,
2 KV heads, head_dim 16 unless noted, ffn 128, F32 tensors (or the layers' projections in `quant`). The
sources read: llama.cpp src/llama-arch.cpp (names), src/llama-model.cpp + src/models/<arch>.cpp (hparams,
graphs), conversion/*.py (what convert_hf_to_gguf writes), ggml-cpu (rope, GELU). Notation: x the residual
stream, rms(x, w) = x / sqrt(mean(x^2) + eps) * w with the stored w as is (gemma's 1 + w is stored already),
attention scale s multiplies q.k before the softmax. RoPE "NORM" (llama.cpp LLAMA_ROPE_TYPE_NORM) rotates
consecutive pairs (x[2i], x[2i+1]); "NEOX" rotates (x[i], x[i + n_rot/2]); both with
theta_i = pos * base^(-2i/n_rot) / freq_factor[i] (freq_factor 1 without a factor tensor), i < n_rot/2,
dims past n_rot untouched. Pre-norm block unless noted: h = x + attn(rms(x, attn_norm)),
out = h + ffn(rms(h, ffn_norm)); SwiGLU ffn = down(silu(gate(y)) * up(y));
logits = output(rms(x, output_norm)) with output.weight or, where absent, token_embd.weight (tied).

Families (name: general.architecture, what differs):

- llama (llama): 2 layers, untied output.weight, attn_q/attn_k permuted by convert's LlamaModel.permute
  (HF rotate-half rows -> interleaved pairs), so RoPE NORM; rope.freq_base 10000; s = 1/sqrt(16).
- llama3 (llama): Llama 3.x. 2 layers, tied, permuted, NORM, rope.freq_base 500000, context_length 16384,
  and the tensor `rope_freqs.weight` [8] = convert's llama3 factors for factor 32, low_freq_factor 1,
  high_freq_factor 4, original_max_position_embeddings 8192: with freq_i = 1/base^(2i/16) and
  wavelen = 2 pi / freq_i: 1 if wavelen < 8192/4, 32 if wavelen > 8192/1, else 1/((1 - a)/32 + a) with
  a = (8192/wavelen - 1)/(4 - 1). Here [1, 1, 1, 1, 3.29, 32, 32, 32]. llama.cpp divides theta_i by it at
  every position (no position threshold). convert writes NO rope.scaling.* keys for llama3 (llama.cpp
  would abort on a scaling type "llama3": it knows none/linear/yarn/longrope); the tensor is the only sign.
- mixtral (llama): 2 layers, untied, permuted, NORM, rope.freq_base 1e6, expert_count 8,
  expert_used_count 2, feed_forward_length 128 = each expert's width; no ffn_gate/ffn_up/ffn_down but
  ffn_gate_inp [8, 64] (router) and ffn_gate_exps / ffn_up_exps [8, 128, 64], ffn_down_exps [8, 64, 128]
  (numpy order: expert, out, in). Router: p = softmax(gate_inp @ y) over all 8, top-2 by p, weights
  p_top / sum(p_top) (llama.cpp build_moe_ffn with norm_w = true; the same as HF's softmax over the top-2
  logits), out = sum_k w_k * down_k(silu(gate_k(y)) * up_k(y)).
- qwen2 (qwen2): 2 layers, untied, attn_q/k/v with biases, NOT permuted, RoPE NEOX, rope.freq_base 1e6,
  rms eps 1e-6.
- qwen3 (qwen3): 2 layers, tied, no biases, key_length = value_length = 32 (head_dim 32, so the q
  projection is 128 wide != hidden 64), attn_q_norm / attn_k_norm [32]: rms over each head's 32 dims
  of q and k, after the projection, before RoPE. NEOX, base 1e6, eps 1e-6.
- qwen3moe (qwen3moe): qwen3's attention (head_dim 32, q/k norms) and, in every layer, 8 experts top-2
  with expert_feed_forward_length 64 (feed_forward_length 128 is written but unused): ffn_gate_inp,
  ffn_{gate,up}_exps [8, 64, 64], ffn_down_exps [8, 64, 64]; routing as mixtral (llama.cpp always
  renormalizes the top-k weights for qwen3moe, HF's norm_topk_prob is not read). Untied.
- gemma2 (gemma2): 4 layers, head_dim 32 (key_length/value_length), tied, x0 = token_embd[ids] * sqrt(64);
  all norms stored as 1 + w (convert adds 1 to every *norm.weight; output_norm ~ 3 here, which sets the
  logit scale); sandwich norms:
  h = x + rms(attn(rms(x, attn_norm)), post_attention_norm),
  out = h + rms(ffn(rms(h, ffn_norm)), post_ffw_norm)
  with GeGLU ffn = down(gelu_tanh(gate(y)) * up(y)) (llama.cpp's CPU GELU rounds through fp16: see
  tests/models/families/test_llama_cpp_logits.py). Attention: q scaled by 1/sqrt(head_dim) = 1/sqrt(32) (llama.cpp uses
  1/sqrt(n_embd/n_head) only for the 27B, and reads no query_pre_attn_scalar), then
  scores = c * tanh(scores / c) with attn_logit_softcapping c = 5, then the mask and softmax;
  logits = f * tanh(logits / f) with final_logit_softcapping f = 10 (Gemma 2 itself uses 50 / 30; smaller
  here so the caps bend these tiny values). attention.sliding_window 8 and no pattern key: llama.cpp's
  gemma2 pattern is 2, layer il slides iff il % 2 == 0 (layers 0, 2 local; 1, 3 global); a local query at
  p sees keys p - 7 .. p (masked when p - k >= 8). No rope keys: base 10000, n_rot 32, NEOX.
- gemma3 (gemma3): 6 layers, as gemma2 (embedding scale, 1 + w norms, sandwich norms, GeGLU, tied,
  head_dim 32, s = 1/sqrt(32)) but no softcaps, attn_q_norm / attn_k_norm [32] (per head, before RoPE, as
  qwen3), rope.freq_base 1e6 on global layers and rope.freq_base_swa 1e4 on local ones,
  attention.sliding_window 8 and, as convert writes it, no sliding_window_pattern key: llama.cpp's
  default pattern 6, layer il local iff il % 6 < 5 (layers 0-4 local, 5 global).
- phi3 (phi3): Phi-3-mini. 2 layers, untied, fused attn_qkv [128, 64] = rows q (64) | k (32) | v (32),
  no attn_q/k/v; ffn_up [256, 64] = rows gate (128) | up (128) with ffn = down(silu(gate) * up); NEOX,
  not permuted, rope.dimension_count 16, context_length 4096, rope.scaling.original_context_length 4096,
  attention.sliding_window 2047 (llama.cpp ignores Phi-3's sliding window: "Phi SWA is currently
  disabled"), no rope.scaling.type (convert's Phi3 writer writes none), no factor tensors. general.name
  "tiny-phi": llama.cpp's vocab loader special-cases names containing "phi3" (it looks up "</s>", "<s>").
- phi3_partial (phi3): Phi-4-mini. As phi3 but tied, partial rotary: rope.dimension_count 8 < head_dim 16
  (NEOX over the first 8 dims of each head: pairs (i, i + 4), theta_i = pos * 10000^(-2i/8) / factor_i,
  dims 8..15 unrotated), LongRoPE tensors rope_factors_long [4] and rope_factors_short [4],
  context_length 4096, rope.scaling.original_context_length 256, rope.scaling.attn_factor
  sqrt(1 + ln(4096/256)/ln(256)) = 1.2247 (convert's longrope attention factor), sliding_window 0.
  llama.cpp multiplies cos and sin (so the rotated dims only) by attn_factor, with either factor set,
  and picks rope_factors_long iff its context size n_ctx > original_context_length (256), else
  rope_factors_short (the choice is per context, not per position; n_ctx is rounded up to a multiple of
  256). The golden `logits` are at n_ctx 4096 (long factors), `logits_short` (positions 32..39 of the
  same tokens) at n_ctx 256 (short factors).
- granite (granite): 2 layers, tied, permuted, NORM, and the multipliers: x0 = token_embd[ids] *
  embedding_scale (1.5); each residual branch scaled: h = x + residual_scale * attn(...),
  out = h + residual_scale * ffn(...) (0.5); attention s = attention.scale (0.1, not 1/sqrt(16));
  logits = output(...) / logit_scale (1.25).
- olmo2 (olmo2): 2 layers, untied (output.weight required), NO attn_norm / ffn_norm; NEOX, not permuted,
  base 500000, eps 1e-6. q_norm over the whole projection: q = rms(Wq x, attn_q_norm[64]),
  k = rms(Wk x, attn_k_norm[32]) (one rms over all heads together), then RoPE; post norms only:
  h = x + rms(attn(x), post_attention_norm), out = h + rms(ffn(h), post_ffw_norm).
- smollm3 (smollm3): 4 layers, tied, permuted, NORM, base 50000. No-RoPE layers: llama.cpp reads no key
  for them, it hard-codes n_no_rope_layer_step = 4: layer il skips RoPE iff (il + 1) % 4 == 0 (here
  layer 3; HF's no_rope_layer_interval 4). Otherwise plain llama.
- gpt-oss (gpt-oss): 2 layers, untied, NEOX, not permuted, key_length 16; q/k/v and attn_output with
  biases; attn_sinks [4] per layer: one extra logit per head that joins the softmax's denominator only,
  p_j = exp(s_j - m) / (sum_k exp(s_k - m) + exp(sink - m)); s = 1/sqrt(16); attention.sliding_window 8,
  no pattern key: llama.cpp's pattern 2 (layer 0 local, layer 1 global), both with the same RoPE.
  RoPE YaRN as convert writes gpt-oss: rope.freq_base 150000, rope.scaling.type yarn, factor 32,
  original_context_length 4096, yarn_beta_fast 32 / yarn_beta_slow 1 (llama.cpp's gpt-oss reads neither
  beta key; its context defaults are the same 32 / 1). ggml's YaRN: extrap_i = pos * base^(-2i/16),
  interp_i = extrap_i / 32, theta_i = interp_i * (1 - r_i) + extrap_i * r_i with
  r_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), lo = max(0, floor(d(32))), hi = min(15, ceil(d(1))),
  d(beta) = 16 ln(4096 / (2 pi beta)) / (2 ln 150000) (here lo 2, hi 5), and cos, sin times
  1 + 0.1 ln 32 = 1.3466. FFN: no ffn_norm, post_attention_norm is the FFN's input norm:
  out = h + moe(rms(h, post_attention_norm)); router ffn_gate_inp weight + bias, 8 experts,
  expert_used_count 4, expert_feed_forward_length 64, expert biases ffn_{gate,up}_exps.bias [8, 64],
  ffn_down_exps.bias [8, 64]. Routing (llama.cpp SOFTMAX_WEIGHT, no renormalization): top-4 by the biased
  router logits, weights = softmax over those 4 logits. Expert: g = gate_e(y) + b, u = up_e(y) + b,
  act = min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1), out_e = down_e(act) + b.
- olmo3 (olmo2): OLMo 3. olmo2's layout with 4 layers, attention.sliding_window 8 and
  attention.sliding_window_pattern the per-layer bool array [T, T, T, F] (convert writes layer_types so):
  layers 0-2 local (a query at p sees keys p - 7 .. p), layer 3 global. RoPE YaRN as convert writes
  Olmo3 (rope.scaling.type yarn, factor 8, original_context_length 64, yarn_attn_factor 1 + 0.1 ln 8,
  betas 32 / 1) on the global layer only: llama.cpp's olmo2 graph rotates the local layers with
  freq_scale 1, ext_factor 0, attn_factor 1 (plain NEOX RoPE at base 500000), the global one with ggml's
  YaRN (see gpt-oss; the file's yarn_attn_factor is not read once ext_factor is 1, the cos/sin factor is
  ggml's 1 + 0.1 ln 8).
- mistral3 (mistral3): Ministral 3. 2 layers, tied, permuted, NORM, base 1e6; YaRN factor 16,
  original_context_length 16, betas 32 / 1 and rope.scaling.yarn_log_multiplier 1 (mscale_all_dim):
  llama.cpp sets yarn_attn_factor = get_mscale(16, 1) / get_mscale(16, 1) / (1 + 0.1 ln 16) and ggml's
  YaRN multiplies it back by 1 + 0.1 ln 16: cos/sin x 1. attention.temperature_scale 0.1
  (llama_4_scaling_beta): after RoPE, q x (1 + 0.1 ln(floor(pos / 16) + 1)) (floor = the YaRN original
  context): 1 at positions 0..15, 1 + 0.1 ln 2 at 16..31, 1 + 0.1 ln 3 at 32..39.
- llama4 (llama4): Llama 4 text. 4 layers, untied, base 500000, NORM rope on Q/K as stored (HF's Llama 4
  rows are interleaved already: convert does not permute), no sliding_window key, so llama.cpp's defaults:
  layers 0-2 RoPE + chunked attention (chunk 8192: a query at p sees keys floor(p / 8192) * 8192 .. p)
  + q, k = rms(q), rms(k) per head without weight after RoPE (4 experts != 128); layer 3 NoPE, every
  key, q x (1 + 0.1 ln(floor((p + 1) / 8192) + 1)). interleave_moe_layer_step 2: layers 1 and 3 have
  4 experts (expert_feed_forward_length 64), top-1 by the router logit, weight sigmoid(logit) applied to
  the expert's input, plus a shared expert ffn_{gate,up,down}_shexp (64 wide) added; layers 0 and 2 a
  dense SwiGLU of 128. The chunk and the temperature matter only past position 8190: the golden's
  long_tokens run (8300 tokens, logits at 8284..8299) covers them.
- gemma4 (gemma4): Gemma 4, E2B-style. 6 layers, tied, NEOX, not permuted, norms stored as they apply
  (convert's norm_shift 0), x0 = token_embd[ids] * sqrt(64), sandwich norms and GeGLU as gemma3 (ggml's
  fp16-table GELU), attention scale 1. attention.sliding_window 8, sliding_window_pattern
  [T, T, T, F, T, F]; local layers: head size 16 (key_length_swa), 2 KV heads, RoPE base 1e4 over 16
  dims; global layers: head size 32 (key_length), 1 KV head, base 1e6 over 32 dims with rope_freqs
  [1 x 4, 1e30 x 12] (only the first 4 frequencies rotate). q = rope(rms(q) * q_norm) (q_norm, k_norm
  ~0.35: at scale 1 with norms ~1 the scores' spread is ~5 and ggml's fp16 GELU rounding alone moved the
  logits by 1.7e-2 of their scale; here 1.5e-3, as for gemma3),
  k = rope(rms(k) * k_norm), v = rms(v) (no weight); the global layers have no attn_v: v = rms(k's
  projection). attention.shared_kv_layers 2: layers 4 and 5 have no K/V of their own and attend over the
  cache of layer 2 (local) and 3 (global) (llama.cpp: n_kv_from_start - 2 / - 1), and a double-wide FFN
  (feed_forward_length [128 x 4, 256 x 2]). Per-layer inputs (embedding_length_per_layer_input 16):
  P = (per_layer_token_embd[ids] * sqrt(16) + rms(per_layer_model_proj(x0) / sqrt(64), per layer of 16,
  per_layer_proj_norm)) / sqrt(2); after each layer's FFN residual, x += rms(proj(gelu(inp_gate(x)) *
  P[layer]), post_norm); then x *= layer_output_scale (0.6 + 0.1 i). Final soft-cap 10.
- gemma4_moe (gemma4): Gemma 4 26B-A4B-style. As gemma4 but 5 layers [T, T, F, T, F], no per-layer inputs,
  no shared KV; every layer: mlp = rms(dense GeGLU(rms(x, ffn_norm)), post_ffw_norm_1) plus
  moe = rms(sum_k w_k s_e down_e(gelu(gate_e y) * up_e y), post_ffw_norm_2) with y = rms(x, pre_ffw_norm_2),
  router logits ffn_gate_inp @ (rms(x) / sqrt(64) * ffn_gate_inp.scale), softmax over 8 experts, top-2
  renormalised, s_e = ffn_down_exps.scale[e]; experts merged as ffn_gate_up_exps [8, 64, 64] (per expert
  32 gate rows then 32 up rows); x + rms(mlp + moe, post_ffw_norm).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_model import (
    _KQUANT_SCALES,
    _permute_for_gguf,
    add_tokenizer,
    add_weight,
    random_kquant,
)

FAMILIES = ("llama", "llama3", "mixtral", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3",
            "phi3_partial", "granite", "olmo2", "smollm3", "gpt-oss", "olmo3", "mistral3", "llama4", "gemma4", "gemma4_moe")
ARCHITECTURES = {"llama": "llama", "llama3": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                 "qwen3moe": "qwen3moe", "gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3",
                 "phi3_partial": "phi3", "granite": "granite", "olmo2": "olmo2", "smollm3": "smollm3",
                 "gpt-oss": "gpt-oss", "olmo3": "olmo2", "mistral3": "mistral3", "llama4": "llama4", "gemma4": "gemma4", "gemma4_moe": "gemma4"}

HIDDEN, HEADS, KV_HEADS, FFN = 64, 4, 2, 128

# llama3 rope scaling (Llama 3.2's values)
LLAMA3_ROPE = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# phi3_partial LongRoPE factors (n_rot / 2 = 4 each) and contexts
PHI3_LONG_FACTORS = [1.0, 2.5, 6.0, 16.0]
PHI3_SHORT_FACTORS = [1.0, 1.1, 1.3, 1.7]
PHI3_PARTIAL_CTX, PHI3_PARTIAL_ORIG_CTX = 4096, 256
# gpt-oss YaRN (gpt-oss-20b's values)
GPT_OSS_YARN = {"factor": 32.0, "original_context_length": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
# olmo3 YaRN (OLMo 3's factor and betas; an original context of 64 so the interpolation reaches most dims)
OLMO3_YARN = {"factor": 8.0, "original_context_length": 64, "beta_fast": 32.0, "beta_slow": 1.0}
# mistral3 (Ministral 3's betas, log multiplier and temperature beta; an original context of 16 so the
# temperature steps at positions 16 and 32 and the interpolation reaches most dims)
MISTRAL3 = {"factor": 16.0, "original_context_length": 16, "beta_fast": 32.0, "beta_slow": 1.0,
            "log_multiplier": 1.0, "temperature_scale": 0.1}
# granite multipliers (the embedding x 1.5 ~ the residual branches x 0.5, so the layers matter)
GRANITE = {"attention_scale": 0.1, "embedding_scale": 1.5, "residual_scale": 0.5, "logit_scale": 1.25}


def llama3_rope_factors(base: float, dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                        original_max_position_embeddings: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.generate_extra_tensors for rope_type llama3 (float32, as its torch)."""
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    freqs = (1.0 / (np.float32(base) ** exponents)).astype(np.float32)
    old = original_max_position_embeddings
    low_wavelen, high_wavelen = old / low_freq_factor, old / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


class _Writer:
    """One GGUF: the metadata helpers, the random tensors (one generator, fixed order) and the tokenizer."""

    def __init__(self, path: Path, arch: str, family: str, seed: int, quant: str | None,
                 tokenizer: Callable[[gguf.GGUFWriter], int] = add_tokenizer) -> None:
        self.tokenizer = tokenizer
        # one stream per (seed, family): families with the same shapes still get different weights
        self.arch, self.rng = arch, np.random.default_rng([seed, zlib.crc32(family.encode())])
        self.qtype = None if quant is None else gguf.GGMLQuantizationType[quant]
        self.w = gguf.GGUFWriter(str(path), arch)
        # not "phi3": llama.cpp's vocab loader special-cases names containing it (looks up "</s>", "<s>", ...)
        self.w.add_name(f"tiny-{family}".replace("phi3", "phi"))

    def kv(self, key: str, value: float | int, kind: str = "f32") -> None:
        getattr(self.w, {"f32": "add_float32", "u32": "add_uint32"}[kind])(f"{self.arch}.{key}", value)

    def hparams(self, layers: int, context: int, ffn: int, eps: float, heads: int = HEADS,
                kv_heads: int = KV_HEADS) -> None:
        w = self.w
        w.add_block_count(layers)
        w.add_context_length(context)
        w.add_embedding_length(HIDDEN)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_layer_norm_rms_eps(eps)

    def finish_metadata(self) -> int:
        self.w.add_file_type(_file_type(self.qtype))
        return self.tokenizer(self.w)

    def normal(self, *shape: int, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + self.rng.standard_normal(n) * 0.1).astype(np.float32)

    def add(self, name: str, arr: np.ndarray) -> None:
        """F32, or the layers' projection matrices (2-D, and 3-D expert stacks) in `quant`."""
        q = self.qtype if name.startswith("blk.") and name.endswith(".weight") and arr.ndim >= 2 else None
        if arr.ndim == 3 and q is not None and arr.shape[-1] % gguf.GGML_QUANT_SIZES[q][0] == 0:
            e, r, c = arr.shape
            data = (random_kquant(q, e * r, c, self.rng) if q.name in _KQUANT_SCALES
                    else gguf.quants.quantize(arr.reshape(e * r, c), q))
            self.w.add_tensor(name, data.reshape(e, r, -1), raw_dtype=q)
            return
        add_weight(self.w, name, arr, q if arr.ndim == 2 else None, self.rng)

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def _file_type(qtype: gguf.GGMLQuantizationType | None) -> int:
    if qtype is None:
        return int(gguf.LlamaFileType.ALL_F32)
    ft = getattr(gguf.LlamaFileType, f"MOSTLY_{qtype.name}", None)
    return int(ft) if ft is not None else int(gguf.LlamaFileType.GUESSED)


def _attention(f: _Writer, p: str, head_dim: int, permute: bool, bias: bool = False,
               q_std: float = 0.15) -> None:
    """attn_q/k/v/output (HF rows, permuted for NORM rope when `permute`, as convert's LlamaModel does)."""
    q = f.normal(HEADS * head_dim, HIDDEN, std=q_std)
    k = f.normal(KV_HEADS * head_dim, HIDDEN, std=q_std)
    if permute:
        q, k = _permute_for_gguf(q, HEADS), _permute_for_gguf(k, KV_HEADS)
    f.add(p + "attn_q.weight", q)
    f.add(p + "attn_k.weight", k)
    f.add(p + "attn_v.weight", f.normal(KV_HEADS * head_dim, HIDDEN, std=0.15))
    if bias:
        f.add(p + "attn_q.bias", f.normal(HEADS * head_dim, std=0.1))
        f.add(p + "attn_k.bias", f.normal(KV_HEADS * head_dim, std=0.1))
        f.add(p + "attn_v.bias", f.normal(KV_HEADS * head_dim, std=0.1))
    f.add(p + "attn_output.weight", f.normal(HIDDEN, HEADS * head_dim, std=0.1))


def _gated_ffn(f: _Writer, p: str, ffn: int = FFN) -> None:
    """ffn_gate / ffn_up / ffn_down (SwiGLU, or GeGLU for gemma)."""
    f.add(p + "ffn_gate.weight", f.normal(ffn, HIDDEN, std=0.15))
    f.add(p + "ffn_up.weight", f.normal(ffn, HIDDEN, std=0.15))
    f.add(p + "ffn_down.weight", f.normal(HIDDEN, ffn, std=0.1))


def _experts(f: _Writer, p: str, n_expert: int, ffn: int) -> None:
    f.add(p + "ffn_gate_inp.weight", f.normal(n_expert, HIDDEN, std=0.3))
    f.add(p + "ffn_gate_exps.weight", f.normal(n_expert, ffn, HIDDEN, std=0.15))
    f.add(p + "ffn_up_exps.weight", f.normal(n_expert, ffn, HIDDEN, std=0.15))
    f.add(p + "ffn_down_exps.weight", f.normal(n_expert, HIDDEN, ffn, std=0.1))


def _embeddings(f: _Writer, vocab: int, tied: bool, std: float = 0.5, out_std: float = 0.3) -> None:
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=std))
    f.add("output_norm.weight", f.norm(HIDDEN))
    if not tied:
        f.add("output.weight", f.normal(vocab, HIDDEN, std=out_std))


def _llama_like(f: _Writer, family: str) -> None:
    """llama, llama3, mixtral, granite, smollm3: convert's LlamaModel layout (Q/K permuted, NORM rope)."""
    layers = 4 if family == "smollm3" else 2
    tied = family in ("llama3", "granite", "smollm3")
    base = {"llama": 1e4, "llama3": 5e5, "mixtral": 1e6, "granite": 1e4, "smollm3": 5e4}[family]
    context = {"llama3": 16384, "mixtral": 32768}.get(family, 2048)
    head_dim = HIDDEN // HEADS
    f.hparams(layers, context, FFN, 1e-5)
    f.w.add_rope_freq_base(base)
    n_expert = 8 if family == "mixtral" else 0
    if n_expert:
        f.w.add_expert_count(n_expert)
        f.w.add_expert_used_count(2)
    vocab = f.finish_metadata()
    f.w.add_vocab_size(vocab)
    f.w.add_rope_dimension_count(head_dim)
    if family == "granite":
        f.w.add_attention_scale(GRANITE["attention_scale"])
        f.w.add_embedding_scale(GRANITE["embedding_scale"])
        f.w.add_residual_scale(GRANITE["residual_scale"])
        f.w.add_logit_scale(GRANITE["logit_scale"])
    _embeddings(f, vocab, tied, std=0.4 if family == "granite" else 0.5)
    if family == "llama3":
        f.add("rope_freqs.weight", llama3_rope_factors(base, head_dim, **LLAMA3_ROPE))
    for i in range(layers):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _attention(f, p, head_dim, permute=True)
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        if n_expert:
            _experts(f, p, n_expert, FFN)
        else:
            _gated_ffn(f, p)


def _qwen(f: _Writer, family: str) -> None:
    """qwen2 (biases), qwen3 (q/k norms, head_dim 32), qwen3moe (+ experts): NEOX, not permuted."""
    head_dim = 16 if family == "qwen2" else 32
    f.hparams(2, 4096, FFN, 1e-6)
    f.w.add_rope_freq_base(1e6)
    if family == "qwen3moe":
        f.w.add_expert_count(8)
        f.w.add_expert_used_count(2)
    if family != "qwen2":
        f.w.add_key_length(head_dim)
        f.w.add_value_length(head_dim)
    if family == "qwen3moe":
        f.w.add_expert_feed_forward_length(64)
    vocab = f.finish_metadata()
    _embeddings(f, vocab, tied=family == "qwen3")
    for i in range(2):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _attention(f, p, head_dim, permute=False, bias=family == "qwen2",
                   q_std=0.15 if family == "qwen2" else 0.2)
        if family != "qwen2":
            f.add(p + "attn_q_norm.weight", f.norm(head_dim))
            f.add(p + "attn_k_norm.weight", f.norm(head_dim))
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        if family == "qwen3moe":
            _experts(f, p, 8, 64)
        else:
            _gated_ffn(f, p)


def _gemma(f: _Writer, family: str) -> None:
    """gemma2 / gemma3: sqrt(hidden)-scaled tied embedding, 1 + w norms, sandwich norms, GeGLU, head_dim 32"""
    head_dim, layers = 32, 4 if family == "gemma2" else 6
    f.hparams(layers, 8192 if family == "gemma2" else 32768, FFN, 1e-6)
    f.w.add_key_length(head_dim)
    f.w.add_value_length(head_dim)
    if family == "gemma3":
        f.w.add_rope_freq_base(1e6)
        f.w.add_rope_freq_base_swa(1e4)
    vocab = f.finish_metadata()
    if family == "gemma2":
        f.w.add_attn_logit_softcapping(5.0)
        f.w.add_final_logit_softcapping(10.0)
    f.w.add_sliding_window(8)
    # embedding x sqrt(64) ~ 1, like the layers' normed outputs; the final norm (stored 1 + w like every
    # gemma norm) ~ 3 sets the logit scale (a tied head on a small embedding would give logits ~ 1)
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.12))
    f.add("output_norm.weight", 3.0 * f.norm(HIDDEN))
    for i in range(layers):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _attention(f, p, head_dim, permute=False, q_std=0.2)
        if family == "gemma3":
            f.add(p + "attn_q_norm.weight", f.norm(head_dim))
            f.add(p + "attn_k_norm.weight", f.norm(head_dim))
        f.add(p + "post_attention_norm.weight", f.norm(HIDDEN))
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        _gated_ffn(f, p)
        f.add(p + "post_ffw_norm.weight", f.norm(HIDDEN))


def _phi3(f: _Writer, partial: bool) -> None:
    head_dim = HIDDEN // HEADS
    rope_dims = 8 if partial else head_dim      # int(partial_rotary_factor * n_embd) // n_head
    context, orig = (PHI3_PARTIAL_CTX, PHI3_PARTIAL_ORIG_CTX) if partial else (4096, 4096)
    w = f.w
    w.add_context_length(context)
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_block_count(2)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(_file_type(f.qtype))
    w.add_sliding_window(0 if partial else 2047)
    if partial:   # convert's longrope attention factor, sqrt(1 + ln(scale) / ln(original context))
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(context / orig) / math.log(orig)))
    vocab = f.tokenizer(w)
    _embeddings(f, vocab, tied=partial)
    if partial:
        f.add("rope_factors_long.weight", np.array(PHI3_LONG_FACTORS, np.float32))
        f.add("rope_factors_short.weight", np.array(PHI3_SHORT_FACTORS, np.float32))
    for i in range(2):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        qkv = np.concatenate([f.normal(HEADS * head_dim, HIDDEN, std=0.15),
                              f.normal(KV_HEADS * head_dim, HIDDEN, std=0.15),
                              f.normal(KV_HEADS * head_dim, HIDDEN, std=0.15)])
        f.add(p + "attn_qkv.weight", qkv)
        f.add(p + "attn_output.weight", f.normal(HIDDEN, HEADS * head_dim, std=0.1))
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        gate_up = [f.normal(FFN, HIDDEN, std=0.15), f.normal(FFN, HIDDEN, std=0.15)]
        f.add(p + "ffn_up.weight", np.concatenate(gate_up))
        f.add(p + "ffn_down.weight", f.normal(HIDDEN, FFN, std=0.1))


def _olmo2(f: _Writer, olmo3: bool) -> None:
    head_dim, layers = HIDDEN // HEADS, 4 if olmo3 else 2
    f.hparams(layers, 4096, FFN, 1e-6)
    f.w.add_rope_freq_base(5e5)
    if olmo3:   # as convert's Olmo2Model writes Olmo3ForCausalLM (rope_scaling yarn, sliding_window, layer_types)
        w = f.w
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(OLMO3_YARN["factor"])
        w.add_rope_scaling_orig_ctx_len(OLMO3_YARN["original_context_length"])
        w.add_rope_scaling_yarn_attn_factor(1.0 + 0.1 * math.log(OLMO3_YARN["factor"]))
        w.add_rope_scaling_yarn_beta_fast(OLMO3_YARN["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(OLMO3_YARN["beta_slow"])
    vocab = f.finish_metadata()
    if olmo3:
        f.w.add_sliding_window(8)
        f.w.add_sliding_window_pattern([(i + 1) % 4 != 0 for i in range(layers)])
    _embeddings(f, vocab, tied=False)
    for i in range(layers):
        p = f"blk.{i}."
        _attention(f, p, head_dim, permute=False)
        f.add(p + "attn_q_norm.weight", f.norm(HEADS * head_dim))
        f.add(p + "attn_k_norm.weight", f.norm(KV_HEADS * head_dim))
        f.add(p + "post_attention_norm.weight", f.norm(HIDDEN))
        _gated_ffn(f, p)
        f.add(p + "post_ffw_norm.weight", f.norm(HIDDEN))


def _mistral3(f: _Writer) -> None:
    """convert's Ministral3Model (LlamaModel: Q/K permuted, NORM rope) with YaRN, the log multiplier and the
    temperature scale."""
    head_dim, layers, m = HIDDEN // HEADS, 2, MISTRAL3
    w = f.w
    f.hparams(layers, 4096, FFN, 1e-5)
    w.add_rope_freq_base(1e6)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(m["factor"])
    w.add_rope_scaling_orig_ctx_len(m["original_context_length"])
    w.add_rope_scaling_yarn_beta_fast(m["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(m["beta_slow"])
    vocab = f.finish_metadata()
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_scaling_yarn_log_mul(m["log_multiplier"])
    w.add_attn_temperature_scale(m["temperature_scale"])
    _embeddings(f, vocab, tied=True)
    for i in range(layers):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _attention(f, p, head_dim, permute=True, q_std=0.25)
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        _gated_ffn(f, p)


def _llama4(f: _Writer) -> None:
    """convert's Llama4Model: Q/K as HF stores them (already interleaved for NORM rope: undo_permute False),
    experts on every 2nd layer with a shared expert, no sliding_window key (llama.cpp's chunked default)."""
    head_dim, layers, n_expert, n_ff_exp = HIDDEN // HEADS, 4, 4, 64
    w = f.w
    f.hparams(layers, 16384, FFN, 1e-5)
    w.add_rope_freq_base(5e5)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(1)
    vocab = f.finish_metadata()
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head_dim)
    w.add_interleave_moe_layer_step(2)
    w.add_expert_feed_forward_length(n_ff_exp)
    _embeddings(f, vocab, tied=False)
    for i in range(layers):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _attention(f, p, head_dim, permute=False, q_std=0.25)
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        if (i + 1) % 2 == 0:
            _experts(f, p, n_expert, n_ff_exp)
            f.add(p + "ffn_gate_shexp.weight", f.normal(n_ff_exp, HIDDEN, std=0.15))
            f.add(p + "ffn_up_shexp.weight", f.normal(n_ff_exp, HIDDEN, std=0.15))
            f.add(p + "ffn_down_shexp.weight", f.normal(HIDDEN, n_ff_exp, std=0.1))
        else:
            _gated_ffn(f, p)


# gemma4: layers 0-2 and 4 local, 3 and 5 global; the last 2 layers read the KV of layers 2 (local) and 3
GEMMA4 = {"swa": [True, True, True, False, True, False], "head_swa": 16, "head_full": 32, "kv_swa": 2,
          "kv_full": 1, "shared_kv": 2, "per_layer": 16, "rot_full": 4}


# gemma4_moe: the 26B-A4B's layout (no per-layer inputs, no shared KV, experts beside the dense MLP)
GEMMA4_MOE = {"swa": [True, True, False, True, False], "experts": 8, "used": 2, "expert_ffn": 32}


def _gemma4(f: _Writer, moe: bool = False) -> None:
    """convert's Gemma4Model, E2B-style: per-layer shapes, K = V on the global KV layer, shared KV layers with
    a double-wide FFN, per-layer inputs, layer output scales, proportional partial RoPE via rope_freqs; `moe`:
    26B-A4B-style, every layer's dense MLP beside 8 experts (merged gate_up, per-expert down scales)."""
    g, w = GEMMA4, f.w
    swa = GEMMA4_MOE["swa"] if moe else GEMMA4["swa"]
    layers, n_pl = len(swa), 0 if moe else GEMMA4["per_layer"]
    first_shared = layers - (0 if moe else g["shared_kv"])
    ffn = [FFN if i < first_shared else 2 * FFN for i in range(layers)]
    w.add_block_count(layers)
    w.add_context_length(32768)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(ffn)
    w.add_head_count(HEADS)
    w.add_head_count_kv([g["kv_swa"] if s else g["kv_full"] for s in swa])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(g["head_full"])
    w.add_value_length(g["head_full"])
    w.add_key_length_swa(g["head_swa"])
    w.add_value_length_swa(g["head_swa"])
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_rope_dimension_count(g["head_full"])
    w.add_rope_dimension_count_swa(g["head_swa"])
    w.add_sliding_window(8)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(layers - first_shared)
    w.add_embedding_length_per_layer_input(n_pl)
    w.add_final_logit_softcapping(10.0)
    if moe:
        w.add_expert_count(GEMMA4_MOE["experts"])
        w.add_expert_used_count(GEMMA4_MOE["used"])
        w.add_expert_feed_forward_length(GEMMA4_MOE["expert_ffn"])
    vocab = f.finish_metadata()
    f.add("token_embd.weight", f.normal(vocab, HIDDEN, std=0.12))
    f.add("output_norm.weight", 3.0 * f.norm(HIDDEN))
    half = g["head_full"] // 2   # proportional RoPE: the first rot_full frequencies rotate, the rest 1e30
    f.add("rope_freqs.weight", np.array([1.0] * g["rot_full"] + [1e30] * (half - g["rot_full"]), np.float32))
    if n_pl:
        table = f.normal(vocab, n_pl * layers, std=0.5)
        if f.qtype is not None and table.shape[1] % gguf.GGML_QUANT_SIZES[f.qtype][0] == 0:
            # a real file's per-layer token table is blocks too (looked up by rows, on the map)
            f.w.add_tensor("per_layer_token_embd.weight", gguf.quants.quantize(table, f.qtype), raw_dtype=f.qtype)
        else:
            f.add("per_layer_token_embd.weight", table)
        f.add("per_layer_model_proj.weight", f.normal(n_pl * layers, HIDDEN, std=0.5))
        f.add("per_layer_proj_norm.weight", f.norm(n_pl))
    for i in range(layers):
        p = f"blk.{i}."
        d, kv = (g["head_swa"], g["kv_swa"]) if swa[i] else (g["head_full"], g["kv_full"])
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        f.add(p + "attn_q.weight", f.normal(HEADS * d, HIDDEN, std=0.2))
        f.add(p + "attn_k.weight", f.normal(kv * d, HIDDEN, std=0.2))
        if swa[i]:   # the global layers have no attn_v: V = K's projection (attention_k_eq_v)
            f.add(p + "attn_v.weight", f.normal(kv * d, HIDDEN, std=0.2))
        f.add(p + "attn_output.weight", f.normal(HIDDEN, HEADS * d, std=0.1))
        # q . k at scale 1 over unit-RMS heads: QK-norm weights ~0.35 keep the scores' spread ~1 (at ~1 the
        # softmax would be so sharp that ggml's fp16 GELU's rounding flips it, see the module docstring)
        f.add(p + "attn_q_norm.weight", 0.35 * f.norm(d))
        f.add(p + "attn_k_norm.weight", 0.35 * f.norm(d))
        f.add(p + "post_attention_norm.weight", f.norm(HIDDEN))
        f.add(p + "ffn_norm.weight", f.norm(HIDDEN))
        _gated_ffn(f, p, ffn[i])
        f.add(p + "post_ffw_norm.weight", f.norm(HIDDEN))
        if n_pl:
            f.add(p + "inp_gate.weight", f.normal(n_pl, HIDDEN, std=0.3))
            f.add(p + "proj.weight", f.normal(HIDDEN, n_pl, std=0.3))
            f.add(p + "post_norm.weight", f.norm(HIDDEN))
        if moe:
            e, ef = GEMMA4_MOE["experts"], GEMMA4_MOE["expert_ffn"]
            f.add(p + "ffn_gate_inp.weight", f.normal(e, HIDDEN, std=0.3))
            f.add(p + "ffn_gate_inp.scale", f.norm(HIDDEN))
            f.add(p + "pre_ffw_norm_2.weight", f.norm(HIDDEN))
            f.add(p + "post_ffw_norm_1.weight", f.norm(HIDDEN))
            f.add(p + "post_ffw_norm_2.weight", f.norm(HIDDEN))
            f.add(p + "ffn_gate_up_exps.weight", f.normal(e, 2 * ef, HIDDEN, std=0.15))
            f.add(p + "ffn_down_exps.weight", f.normal(e, HIDDEN, ef, std=0.1))
            f.add(p + "ffn_down_exps.scale", (1.0 + f.rng.standard_normal(e) * 0.3).astype(np.float32))
        f.add(p + "layer_output_scale.weight", np.array([0.6 + 0.1 * i], np.float32))


def _gpt_oss(f: _Writer) -> None:
    head_dim, layers, n_expert, n_ff = HIDDEN // HEADS, 2, 8, 64
    w = f.w
    f.hparams(layers, 131072, n_ff, 1e-5)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(GPT_OSS_YARN["factor"])
    w.add_rope_scaling_orig_ctx_len(GPT_OSS_YARN["original_context_length"])
    w.add_rope_scaling_yarn_beta_fast(GPT_OSS_YARN["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(GPT_OSS_YARN["beta_slow"])
    w.add_rope_freq_base(150000.0)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(4)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    vocab = f.finish_metadata()
    w.add_sliding_window(8)
    w.add_expert_feed_forward_length(n_ff)
    _embeddings(f, vocab, tied=False)
    for i in range(layers):
        p = f"blk.{i}."
        f.add(p + "attn_norm.weight", f.norm(HIDDEN))
        _attention(f, p, head_dim, permute=False, bias=True)
        f.add(p + "attn_output.bias", f.normal(HIDDEN, std=0.1))
        f.add(p + "attn_sinks.weight", (1.0 + f.rng.standard_normal(HEADS)).astype(np.float32))
        f.add(p + "post_attention_norm.weight", f.norm(HIDDEN))   # the FFN's input norm
        f.add(p + "ffn_gate_inp.weight", f.normal(n_expert, HIDDEN, std=0.3))
        f.add(p + "ffn_gate_inp.bias", f.normal(n_expert, std=0.5))
        f.add(p + "ffn_gate_exps.weight", f.normal(n_expert, n_ff, HIDDEN, std=0.15))
        f.add(p + "ffn_gate_exps.bias", f.normal(n_expert, n_ff, std=3.0))   # some gates past the clamp at 7
        f.add(p + "ffn_up_exps.weight", f.normal(n_expert, n_ff, HIDDEN, std=0.15))
        f.add(p + "ffn_up_exps.bias", f.normal(n_expert, n_ff, std=3.0))
        f.add(p + "ffn_down_exps.weight", f.normal(n_expert, HIDDEN, n_ff, std=0.03))
        f.add(p + "ffn_down_exps.bias", f.normal(n_expert, HIDDEN, std=0.1))


def write_tiny_family(path: str | Path, family: str, seed: int = 0, quant: str | None = None,
                      tokenizer: Callable[[gguf.GGUFWriter], int] = add_tokenizer) -> Path:
    """Write the tiny random `family` model (one of FAMILIES) to `path`; return it. The same arguments
    always give the same bytes. quant: None (all F32) or a GGML type name ("Q8_0", "Q4_0", "Q4_K", ...)
    for the layers' projection matrices (see tiny_model.add_weight); norms, embeddings, factors stay F32.
    tokenizer: writes the vocabulary and returns its size (default tiny_model.add_tokenizer; e.g.
    tiny_harmony.add_harmony_tokenizer for gpt-oss's real pre-tokenizer and special tokens)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = _Writer(path, ARCHITECTURES[family], family, seed, quant, tokenizer)
    if family in ("llama", "llama3", "mixtral", "granite", "smollm3"):
        _llama_like(f, family)
    elif family in ("qwen2", "qwen3", "qwen3moe"):
        _qwen(f, family)
    elif family in ("gemma2", "gemma3"):
        _gemma(f, family)
    elif family in ("phi3", "phi3_partial"):
        _phi3(f, partial=family == "phi3_partial")
    elif family in ("olmo2", "olmo3"):
        _olmo2(f, olmo3=family == "olmo3")
    elif family == "mistral3":
        _mistral3(f)
    elif family == "llama4":
        _llama4(f)
    elif family in ("gemma4", "gemma4_moe"):
        _gemma4(f, moe=family == "gemma4_moe")
    else:
        _gpt_oss(f)
    f.close()
    return path
