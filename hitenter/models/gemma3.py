"""Gemma 3 decoder (text) in plain PyTorch, built from GGUF tensors; same contracts as llama.py.

What differs from Llama (HF transformers' Gemma3ForCausalLM, llama.cpp's LLM_ARCH_GEMMA3):
* the embedding is scaled by sqrt(hidden_size) (HF rounds the scale to the weight dtype first);
* four RMSNorms per layer: x + post_attn_norm(Attn(attn_norm(x))), then x + post_ffw_norm(GeGLU(ffn_norm(x)));
  Gemma's norm is x_hat * (1 + w): convert_hf_to_gguf already stores 1 + w (Gemma3Model.norm_shift), so
  the GGUF weight is used as is, through llama.py's RMSNorm;
* QK-norm: RMSNorm (same 1 + w storage) over each query / key head before RoPE;
* GeGLU: gelu(gate, tanh approximation) * up;
* attention scale query_pre_attn_scalar ** -0.5 (head_dim unless the GGUF says otherwise);
* local (sliding-window) layers interleaved with global ones: layer i is global when
  (i + 1) % sliding_window_pattern == 0 (5 local : 1 global), local layers see only their last
  `sliding_window` keys and use RoPE base rope_local_theta (10k), global layers rope_theta (1M, with
  optional linear scaling);
* optional final logit soft-capping (none in Gemma 3's GGUFs).
RoPE pairing is rotate-half (NEOX) and the GGUF Q/K are not permuted, so no un-permute is needed.
Batch invariance: as llama.py (row-wise ops, GEMM rows padded to a multiple of 8, attention.py's contract,
which holds with a window too).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.models import layer_routing
from hitenter.models.attention import KEY_TILE, AttentionMetadata, paged_attention, write_kv
from hitenter.models.llama import (
    RMSNorm,
    Rope,
    embed_and_head,
    fused_linear,
    has_dense_gemms,
    make_linear,
    pad_rows,
)
from hitenter.models.row_invariance import attention_row_multiple
from hitenter.quant import weight_bytes


def layer_windows(cfg: ModelConfig) -> list[int | None]:
    """Per layer, its sliding window (a local layer) or None (a global layer); llama.cpp's swa pattern."""
    if cfg.sliding_window <= 0:
        return [None] * cfg.num_layers
    p = cfg.sliding_window_pattern
    return [None if p > 0 and (i + 1) % p == 0 else cfg.sliding_window for i in range(cfg.num_layers)]


def windowed_kv_bytes(cfg: ModelConfig, num_tokens: int, block_size: int, dtype_bytes: int = 4) -> tuple[int, int]:
    """(KV bytes one sequence of num_tokens holds now, bytes it would hold if each local layer kept only
    the blocks its window can still reach) -- the memory a hybrid allocator (vLLM's) would save.

    hitenter keeps one block table for all layers (so prefix caching, preemption and the kernels stay as
    they are) and masks old keys instead of freeing them; this is the cost of that choice, logged at start."""
    per_layer_token = 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    blocks = -(-num_tokens // block_size)
    now = held = 0
    for win in layer_windows(cfg):
        now += blocks * block_size * per_layer_token
        # the next token's window starts at num_tokens + 1 - win: blocks wholly before it are dead
        dead = 0 if win is None else max(0, num_tokens + 1 - win) // block_size
        held += (blocks - dead) * block_size * per_layer_token
    return now, held


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Torch-order shape of every tensor a Gemma 3 model needs."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            shapes[p + norm + ".weight"] = (h,)
        shapes.update({
            p + "attn_q_norm.weight": (d,), p + "attn_k_norm.weight": (d,),
            p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
            p + "attn_output.weight": (h, q),
            p + "ffn_gate.weight": (f, h), p + "ffn_up.weight": (f, h), p + "ffn_down.weight": (h, f),
        })
    return shapes


class Gemma3Layer(nn.Module):
    """One decoder layer (see the module docstring); `window` None for a global layer."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], i: int, dtype: torch.dtype, window: int | None) -> None:
        super().__init__()
        p, eps = f"blk.{i}.", cfg.rms_norm_eps
        self.cfg, self.window = cfg, window
        self.attn_norm = RMSNorm(w[p + "attn_norm.weight"], eps, dtype)
        self.post_attn_norm = RMSNorm(w[p + "post_attention_norm.weight"], eps, dtype)
        self.ffn_norm = RMSNorm(w[p + "ffn_norm.weight"], eps, dtype)
        self.post_ffw_norm = RMSNorm(w[p + "post_ffw_norm.weight"], eps, dtype)
        self.q_norm = RMSNorm(w[p + "attn_q_norm.weight"], eps, dtype)
        self.k_norm = RMSNorm(w[p + "attn_k_norm.weight"], eps, dtype)
        self.qkv = fused_linear([w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]],
                               None, dtype)
        self.o_proj = make_linear(w[p + "attn_output.weight"], None, dtype)
        self.gate_up = fused_linear([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]], None, dtype)
        self.down = make_linear(w[p + "ffn_down.weight"], None, dtype)
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        self.attn_row_multiple = attention_row_multiple(dtype, cfg.head_dim, KEY_TILE)

    def forward(self, x: torch.Tensor, rope: Rope, cos_sin: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionMetadata, kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        """Generation rows through the fused native layer where it runs, the others `forward_torch`."""
        return layer_routing.layer_forward(self, x, rope, cos_sin, attn, kv_cache, n_real)

    def forward_torch(self, x: torch.Tensor, rope: Rope, cos_sin: tuple[torch.Tensor, torch.Tensor],
                      attn: AttentionMetadata, kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        d = self.cfg.head_dim
        qkv = self.qkv(self.attn_norm(x))
        t = qkv.shape[0]
        q = self.q_norm(qkv[:, :self.q_size].reshape(t, self.num_heads, d))
        k = self.k_norm(qkv[:, self.q_size:self.q_size + self.kv_size].reshape(t, self.num_kv_heads, d))
        q, k = rope.rotate(q, cos_sin), rope.rotate(k, cos_sin)
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, d)
        write_kv(kv_cache, k[:n_real], v[:n_real], attn.slot_mapping)
        o = paged_attention(q[:n_real], kv_cache, attn, self.scale, self.attn_row_multiple,
                            window=self.window).view(n_real, -1)
        if n_real < t:   # padding rows (batch-invariant GEMM shapes)
            o = torch.cat([o, o.new_zeros(t - n_real, o.shape[1])])
        x = x + self.post_attn_norm(self.o_proj(o))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.post_ffw_norm(self.down(F.gelu(gate, approximate="tanh") * up))


def _global_rope(cfg: ModelConfig, max_pos: int) -> Rope:
    rope = Rope(cfg.head_dim, cfg.rope_theta, 1)
    if cfg.rope_scaling_factor != 1.0:   # linear scaling: positions / factor, i.e. frequencies / factor
        rope.inv_freq = rope.inv_freq / cfg.rope_scaling_factor
    rope._build(max_pos)
    return rope


class Gemma3Model(nn.Module):
    """Gemma 3 causal LM (text); the same forward / compute_logits contract as llama.LlamaModel."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config, self.dtype, self.tp = cfg, dtype, None
        self.embed, self.head = embed_and_head(cfg, w, dtype, None)   # dense, GGUF blocks or hitenter/quant
        # HF: hidden_size ** 0.5 rounded to the weight dtype before the multiply
        self.embed_scale = float(torch.tensor(math.sqrt(cfg.hidden_size), dtype=dtype))
        self.windows = layer_windows(cfg)
        self.layers = nn.ModuleList(Gemma3Layer(cfg, w, i, dtype, win) for i, win in enumerate(self.windows))
        self.norm = RMSNorm(w["output_norm.weight"], cfg.rms_norm_eps, dtype)
        max_pos = min(cfg.context_length, 4096)
        self.rope_global = _global_rope(cfg, max_pos)
        self.rope_local = Rope(cfg.head_dim, cfg.rope_local_theta, max_pos)
        self.rope = self.rope_global   # the global layers' RoPE (trace, the playground's RoPE panel)
        self.batch_invariant = True   # see llama.LlamaModel
        self.dense_gemms = has_dense_gemms(self)
        self.weight_format = "dense"   # the loader names the format it built

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        return pad_rows(x) if self.batch_invariant and self.dense_gemms else x

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Hidden states after the final norm, `[T, H]`; writes the new tokens' K/V into kv_caches."""
        n = int(input_ids.shape[0])
        ids, pos = self._pad(input_ids.long()), self._pad(positions.long())
        x = self.embed(ids) * self.embed_scale
        glob, loc = self.rope_global.table(pos, x.dtype), self.rope_local.table(pos, x.dtype)
        layer_ropes = [(self.rope_local, loc) if layer.window is not None else (self.rope_global, glob)
                       for layer in self.layers]
        return self.norm(layer_routing.run_layers(self, x, attn, kv_caches, layer_ropes, [glob, loc], n))[:n]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[N, V]` (row-padded GEMM, batch invariant), soft-capped when the model says so."""
        n = hidden.shape[0]
        logits = self.head(self._pad(hidden.to(self.dtype)))[:n].float()
        cap = self.config.final_logit_softcap
        return torch.tanh(logits / cap) * cap if cap > 0 else logits

    def weight_bytes(self) -> int:
        return weight_bytes(self)
