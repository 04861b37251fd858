"""The blocks every decoder family is built from (hitenter/models/decoder.py; the encoders of
hitenter/models/encoder.py too): RMSNorm, LayerNorm, RoPE, linear layers by weight layout, the embedding and
LM head, row padding.

Weights: dense tensors run as `Linear` (models/linear.py), GGUF blocks as `BlockLinear` /
`BlockEmbedding` (models/block_linear.py, the native qmatmul), int8/int4 layouts by hitenter/quant.
RoPE is rotate-half (NEOX) pairing (i, i + D/2): llama.cpp's NORM-rope families (llama, granite, smollm3)
store Q/K permuted for the interleaved pairing (convert_hf_to_gguf); the loader un-permutes them
(`unpermute_qk`), as HF transformers does, so every family uses the same rotate-half code.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.kernels import BlockWeight
from hitenter.models.attention import ROW_MULTIPLE
from hitenter.models.block_linear import BlockEmbedding, BlockLinear, fuse_rows
from hitenter.models.linear import Linear
from hitenter.models.shard import TensorParallel
from hitenter.quant import ExactEmbedding, HeadWeight, RescoredHead, cat_rows, quant_linear


def pad_rows(x: torch.Tensor, multiple: int = ROW_MULTIPLE) -> torch.Tensor:
    """x with zero rows appended so that x.shape[0] is a multiple of `multiple` (x itself if it is)."""
    n = x.shape[0]
    r = (-n) % multiple
    if r == 0:
        return x
    return torch.cat([x, x.new_zeros((r,) + tuple(x.shape[1:]))])


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's llama Q/K permutation (interleaved -> rotate-half row order)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _param(t: torch.Tensor, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(t.to(dtype).contiguous(), requires_grad=False)


def make_linear(weight: torch.Tensor | Any, bias: torch.Tensor | None, dtype: torch.dtype) -> nn.Module:
    """A module chosen by the weight's layout: fp32/bf16 tensors -> Linear, GGUF blocks -> BlockLinear,
    int8/int4 -> hitenter/quant."""
    if isinstance(weight, torch.Tensor):
        return Linear(weight, bias, dtype)
    if isinstance(weight, BlockWeight):
        return BlockLinear([weight], bias)
    return quant_linear(weight, bias, dtype)


def fused_linear(ws: list[Any], bias: torch.Tensor | None, dtype: torch.dtype) -> nn.Module:
    """One module for projections sharing an input (Q/K/V, gate/up): their rows concatenated.

    GGUF blocks: one qmatmul per run of one block type (fuse_rows). A mix of blocks and dense tensors
    (an F16 piece beside quantized ones) is dequantized to one dense Linear: rare, and it keeps one GEMM."""
    if all(isinstance(w, BlockWeight) for w in ws):
        return BlockLinear(fuse_rows(ws), bias)
    if any(isinstance(w, BlockWeight) for w in ws):
        ws = [w.dequantize() if isinstance(w, BlockWeight) else w for w in ws]
    return make_linear(cat_rows(ws), bias, dtype)


def has_dense_gemms(model: nn.Module) -> bool:
    """True when some linear of ``model`` needs rows padded to a multiple of 8 for batch invariance (dense
    GEMMs, or block weights on the torch reference path); the native and torch quantized kernels do not."""
    return any(isinstance(m, Linear) or getattr(m, "needs_row_padding", False) for m in model.modules())


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(weight, dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the fused op: in fp32 bitwise the HF recipe; in bf16 it rounds once at the end instead of
        # before the weight multiply (no bf16 golden depends on that order). Row-wise either way.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with a bias (BERT; llama.cpp's LLM_NORM): (x - mean) / sqrt(var + eps) * weight + bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(weight, dtype)
        self.bias = None if bias is None else _param(bias, dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class Rope(nn.Module):
    """Rotate-half (NEOX) rotary embedding with a cos/sin table indexed by position.

    `rope_dim` (default head_dim): the first rope_dim dimensions of a head are rotated, pairs (i, i + rope_dim/2),
    the rest pass through (partial rotary: Phi-4-mini). `freq_factors` (llama.cpp's `rope_freqs` /
    `rope_factors_*` tensors, Llama 3 / LongRoPE scaling) divide the frequencies, `scale` (linear scaling)
    divides the positions, and `attn_factor` multiplies cos and sin (llama.cpp's `ggml_rope_ext` with
    ext_factor 0: theta = pos / scale * base^(-2i/d) / factor_i). The table follows HF's float32 recipe
    (inv_freq in fp32, positions x inv_freq in fp32), as its Llama 3 scaling does."""

    def __init__(self, head_dim: int, theta: float, max_pos: int, rope_dim: int = 0,
                 freq_factors: torch.Tensor | None = None, scale: float = 1.0, attn_factor: float = 1.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rope_dim = rope_dim or head_dim
        rd = self.rope_dim
        inv = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.int64).float() / rd))
        if freq_factors is not None:
            inv = inv / freq_factors.float().reshape(-1)[: rd // 2]
        self.inv_freq = inv / scale if scale != 1.0 else inv
        self.attn_factor = attn_factor
        self._build(max_pos)

    def _build(self, n: int) -> None:
        """The tables for positions 0..n-1, set by one assignment: the engine thread and the side prefill's
        thread (hitenter/engine/side_prefill.py) may read them while the other grows them."""
        freqs = torch.outer(torch.arange(n, dtype=torch.int64).float(), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attn_factor != 1.0:
            cos, sin = cos * self.attn_factor, sin * self.attn_factor
        self.cos_sin = (cos, sin)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `[T, 1, rope_dim]` for these positions (computed once per step, shared by all layers)."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        cos, sin = self.cos_sin
        if need > cos.shape[0]:
            self._build(max(need, 2 * cos.shape[0]))
            cos, sin = self.cos_sin
        return cos[positions].unsqueeze(1).to(dtype), sin[positions].unsqueeze(1).to(dtype)

    def rotate(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x `[T, heads, D]` rotated by the table of its positions (the first rope_dim dims of each head)."""
        cos, sin = cos_sin
        rd = self.rope_dim
        if rd < self.head_dim:
            return torch.cat([self.rotate_full(x[..., :rd], cos, sin), x[..., rd:]], dim=-1)
        return self.rotate_full(x, cos, sin)

    def rotate_full(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin


def yarn_freq_factors(rope_dim: int, theta: float, factor: float, original_context: int, beta_fast: float,
                      beta_slow: float) -> torch.Tensor:
    """YaRN as ggml's rope computes it (ext_factor 1), as one factor per frequency that divides it:
    theta_i = pos * base^(-2i/d) * ((1 - r_i) / factor + r_i), r_i the ramp from interpolation (r = 0, low
    frequencies) to extrapolation (r = 1, high ones) between the correction dims of beta_fast and beta_slow
    (`ggml_rope_yarn_corr_dims`); the attention factor is the config's rope_attn_factor."""
    def corr(n_rot: float) -> float:
        return rope_dim * math.log(original_context / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = max(0.0, math.floor(corr(beta_fast))), min(rope_dim - 1.0, math.ceil(corr(beta_slow)))
    i = torch.arange(rope_dim // 2, dtype=torch.float64)
    r = 1.0 - ((i - lo) / max(0.001, hi - lo)).clamp(0.0, 1.0)
    return (1.0 / ((1.0 - r) / factor + r)).float()


def finish_logits(cfg: ModelConfig, logits: torch.Tensor) -> torch.Tensor:
    """fp32 logits as the family scales them: times ``logit_scale``, then the final soft-cap where it has one."""
    if cfg.logit_scale != 1.0:
        logits = logits * cfg.logit_scale
    cap = cfg.final_logit_softcap
    return torch.tanh(logits / cap) * cap if cap > 0 else logits


def embed_and_head(cfg: ModelConfig, w: dict[str, Any], dtype: torch.dtype,
                   tp: TensorParallel | None) -> tuple[nn.Module, nn.Module]:
    """The token embedding and the LM head modules, by the tables' layout.

    GGUF blocks: a BlockEmbedding (rows dequantized on lookup) and a BlockLinear head; tied, both over
    the same bytes (under tp: this rank's vocab rows, vocab-parallel). Quantized (hitenter/quant; tp is None): the exact table and a rescored head. Dense:
    nn.Embedding (vocab-parallel under tp) and a Linear, packed for oneDNN where it can be (a tied
    table then stays plain for lookups)."""
    emb = w["token_embd.weight"]
    head = emb if cfg.tie_word_embeddings else w["output.weight"]
    if isinstance(emb, HeadWeight):
        return ExactEmbedding(emb.exact, dtype), RescoredHead(quant_linear(head.coarse, None, dtype), head.exact)
    if isinstance(emb, BlockWeight):   # under tp: this rank's vocab rows (shared with a tied head's)
        embed: nn.Module = BlockEmbedding(emb) if tp is None else tp.vocab_embedding(emb, dtype)
    elif tp is None:
        embed = nn.Embedding.from_pretrained(emb.to(dtype), freeze=True)
    else:   # vocab-parallel: this rank's rows; looks up its own ids and all-reduces
        embed = tp.vocab_embedding(emb, dtype)
    if isinstance(head, BlockWeight):
        return embed, BlockLinear([head if tp is None else tp.vocab_shard(head, dtype)])
    if cfg.tie_word_embeddings:
        return embed, Linear(embed.weight, None, dtype)
    return embed, Linear(head if tp is None else tp.vocab_shard(head, dtype), None, dtype)
