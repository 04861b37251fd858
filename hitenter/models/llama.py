"""Llama / Qwen2 decoder in plain PyTorch (fp32 on CPU), built directly from GGUF tensors.

Contracts:
* `model(input_ids [T], positions [T], attn, kv_caches) -> hidden [T, H]` (after the final RMSNorm);
  the new tokens' K/V are written into `kv_caches` (one tensor per layer, see attention.py).
* `model.compute_logits(hidden [N, H]) -> fp32 logits [N, V]`.
* Batch invariance: every op is row-wise, and all GEMMs run on a row count padded to a multiple of 8
  (torch CPU gives a row the same bits for any M % 8 == 0, but not for M = 1, 2, 3, ...), so a row's
  hidden state / logits do not depend on what else is in the batch. Attention is per sequence.
* RoPE: rotate-half (NEOX) pairing (i, i + D/2). GGUF llama Q/K weights are stored permuted for the
  interleaved pairing (convert_hf_to_gguf); the loader un-permutes them (`unpermute_qk`), as HF
  transformers does, so both architectures use the same rotate-half code. Qwen2 GGUFs are not permuted.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.models.attention import AttentionMetadata, paged_attention, write_kv

ROW_MULTIPLE = 8


def pad_rows(x: torch.Tensor, multiple: int = ROW_MULTIPLE) -> torch.Tensor:
    """x with zero rows appended so that x.shape[0] is a multiple of `multiple` (x itself if it is)."""
    n = x.shape[0]
    r = (-n) % multiple
    if r == 0:
        return x
    return torch.cat([x, x.new_zeros((r,) + tuple(x.shape[1:]))])


def _no_pad(x: torch.Tensor) -> torch.Tensor:
    return x


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's llama Q/K permutation (interleaved -> rotate-half row order)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _param(t: torch.Tensor, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(t.to(dtype).contiguous(), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b). Callers pass row counts that are multiples of 8 (see module doc)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(weight, dtype)
        self.bias = None if bias is None else _param(bias, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm order: x * rsqrt(mean(x^2) + eps), then * weight (fp32 math)."""

    def __init__(self, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(weight, dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        return self.weight * (xf * torch.rsqrt(var + self.eps)).to(x.dtype)


class Rope(nn.Module):
    """Rotate-half rotary embedding with a cos/sin table indexed by position (HF float32 recipe)."""

    def __init__(self, head_dim: int, theta: float, max_pos: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self._build(max_pos)

    def _build(self, n: int) -> None:
        freqs = torch.outer(torch.arange(n, dtype=torch.int64).float(), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x `[T, heads, D]`, positions `[T]` -> rotated x."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        if need > self.cos.shape[0]:
            self._build(max(need, 2 * self.cos.shape[0]))
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        half = self.head_dim // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin


class DecoderLayer(nn.Module):
    """Pre-norm block: x + Attn(norm(x)); x + SwiGLU(norm(x)). Q/K/V and gate/up are fused."""

    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], i: int, dtype: torch.dtype) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.cfg = cfg
        self.attn_norm = RMSNorm(w[p + "attn_norm.weight"], cfg.rms_norm_eps, dtype)
        self.ffn_norm = RMSNorm(w[p + "ffn_norm.weight"], cfg.rms_norm_eps, dtype)
        qkv_w = torch.cat([w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]])
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat([w[p + "attn_q.bias"], w[p + "attn_k.bias"], w[p + "attn_v.bias"]])
        self.qkv = Linear(qkv_w, qkv_b, dtype)
        self.o_proj = Linear(w[p + "attn_output.weight"], None, dtype)
        self.gate_up = Linear(torch.cat([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]]), None, dtype)
        self.down = Linear(w[p + "ffn_down.weight"], None, dtype)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: Rope, attn: AttentionMetadata,
                kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        cfg = self.cfg
        h = self.attn_norm(x)
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = rope(q.reshape(-1, cfg.num_heads, cfg.head_dim), positions)
        k = rope(k.reshape(-1, cfg.num_kv_heads, cfg.head_dim), positions)
        v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        write_kv(kv_cache, k[:n_real], v[:n_real], attn.slot_mapping)
        o = torch.zeros_like(q)
        o[:n_real] = paged_attention(q[:n_real], kv_cache, attn, self.scale)
        x = x + self.o_proj(o.reshape(o.shape[0], -1))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class LlamaModel(nn.Module):
    """Llama / Qwen2 causal LM; built from dequantized GGUF tensors (Q/K already un-permuted for llama)."""

    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.embed = nn.Embedding.from_pretrained(w["token_embd.weight"].to(dtype), freeze=True)
        self.layers = nn.ModuleList(DecoderLayer(cfg, w, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(w["output_norm.weight"], cfg.rms_norm_eps, dtype)
        head = w["token_embd.weight"] if cfg.tie_word_embeddings else w["output.weight"]
        self.lm_head = self.embed.weight if cfg.tie_word_embeddings else _param(head, dtype)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, min(cfg.context_length, 4096))
        # True: GEMM row counts padded to a multiple of 8 so results are bitwise batch invariant.
        # False: no padding; a lone decode row then takes torch's faster GEMV path (different bits).
        self.batch_invariant = True

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Hidden states after the final norm, `[T, H]`; writes the new tokens' K/V into kv_caches."""
        n = int(input_ids.shape[0])
        pad = pad_rows if self.batch_invariant else _no_pad
        ids = pad(input_ids.long())
        pos = pad(positions.long())
        x = self.embed(ids)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, pos, self.rope, attn, cache, n)
        return self.norm(x)[:n]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[N, V]` for hidden `[N, H]` (row-padded GEMM, batch invariant)."""
        n = hidden.shape[0]
        pad = pad_rows if self.batch_invariant else _no_pad
        return F.linear(pad(hidden.to(self.dtype)), self.lm_head)[:n].float()
