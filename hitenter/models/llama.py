"""Llama / Qwen2 decoder in plain PyTorch (fp32 on CPU), built directly from GGUF tensors.

Weights: dense tensors run as `Linear` (models/linear.py), GGUF blocks as `BlockLinear` /
`BlockEmbedding` (models/block_linear.py, the native qmatmul), int8/int4 layouts by hitenter/quant.

Contracts:
* `model(input_ids [T], positions [T], attn, kv_caches) -> hidden [T, H]` (after the final RMSNorm);
  the new tokens' K/V are written into `kv_caches` (one tensor per layer, see attention.py).
* `model.compute_logits(hidden [N, H]) -> fp32 logits [N, V]`.
* Batch invariance: every op is row-wise, and all GEMMs run on a row count padded to a multiple of 8
  (torch CPU gives a row the same bits for any M % 8 == 0, but not for M = 1, 2, 3, ...), so a row's
  hidden state / logits do not depend on what else is in the batch (quantized models skip the padding:
  their kernels are row-count invariant). Attention: see attention.py.
* RoPE: rotate-half (NEOX) pairing (i, i + D/2). GGUF llama Q/K weights are stored permuted for the
  interleaved pairing (convert_hf_to_gguf); the loader un-permutes them (`unpermute_qk`), as HF
  transformers does, so both architectures use the same rotate-half code. Qwen2 GGUFs are not permuted.
* Tensor parallelism (hitenter/distributed): built with a `TensorParallel` group, each layer takes its
  shard of the full tensors at load (Q/K/V and gate/up column-parallel, o_proj and down row-parallel,
  one all-reduce each; see `tp_shard` for how heads are split) and the group supplies the
  vocab-parallel embedding / LM head. Without one (tp=None) the model is exactly the single-process one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.kernels import BlockWeight
from hitenter.models import layer_routing
from hitenter.models.attention import KEY_TILE, ROW_MULTIPLE, AttentionMetadata, paged_attention, write_kv
from hitenter.models.block_linear import BlockEmbedding, BlockLinear, fuse_rows
from hitenter.models.linear import Linear
from hitenter.models.row_invariance import attention_row_multiple
from hitenter.models.shard import TensorParallel, tp_shard
from hitenter.quant import ExactEmbedding, HeadWeight, RescoredHead, cat_rows, quant_linear, weight_bytes


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

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `[T, 1, D]` for these positions (computed once per step, shared by all layers)."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        if need > self.cos.shape[0]:
            self._build(max(need, 2 * self.cos.shape[0]))
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)

    def rotate(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x `[T, heads, D]` rotated by the table of its positions."""
        cos, sin = cos_sin
        half = self.head_dim // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin


class DecoderLayer(nn.Module):
    """Pre-norm block: x + Attn(norm(x)); x + SwiGLU(norm(x)). Q/K/V and gate/up are fused."""

    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], i: int, dtype: torch.dtype,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.cfg = cfg
        self.tp = tp
        self.attn_norm = RMSNorm(w[p + "attn_norm.weight"], cfg.rms_norm_eps, dtype)
        self.ffn_norm = RMSNorm(w[p + "ffn_norm.weight"], cfg.rms_norm_eps, dtype)
        d = cfg.head_dim
        q0, self.num_heads, kv0, self.num_kv_heads, f0, f = tp_shard(cfg, tp)

        def rows(name: str, start: int, n: int) -> Any:   # this rank's output rows (whole when tp=None)
            return w[p + name].narrow(0, start, n)

        qkv_w = [rows("attn_q.weight", q0 * d, self.num_heads * d),
                 rows("attn_k.weight", kv0 * d, self.num_kv_heads * d),
                 rows("attn_v.weight", kv0 * d, self.num_kv_heads * d)]
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat([rows("attn_q.bias", q0 * d, self.num_heads * d),
                               rows("attn_k.bias", kv0 * d, self.num_kv_heads * d),
                               rows("attn_v.bias", kv0 * d, self.num_kv_heads * d)])
        self.qkv = fused_linear(qkv_w, qkv_b, dtype)                             # column-parallel
        self.o_proj = make_linear(w[p + "attn_output.weight"].narrow(1, q0 * d, self.num_heads * d), None, dtype)
        self.gate_up = fused_linear([rows("ffn_gate.weight", f0, f), rows("ffn_up.weight", f0, f)], None, dtype)
        self.down = make_linear(w[p + "ffn_down.weight"].narrow(1, f0, f), None, dtype)  # row-parallel
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.attn_row_multiple = attention_row_multiple(dtype, cfg.head_dim, KEY_TILE)

    def forward(self, x: torch.Tensor, rope: Rope, cos_sin: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionMetadata, kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        """The layer on the step's rows: generation rows through the fused native layer where it runs
        (models/fused_decode.py), the others through `forward_torch`, the statement of the math."""
        return layer_routing.layer_forward(self, x, rope, cos_sin, attn, kv_cache, n_real)

    def forward_torch(self, x: torch.Tensor, rope: Rope, cos_sin: tuple[torch.Tensor, torch.Tensor],
                      attn: AttentionMetadata, kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        d = self.cfg.head_dim
        qkv = self.qkv(self.attn_norm(x))
        t = qkv.shape[0]
        qk = rope.rotate(qkv[:, :self.q_size + self.kv_size].view(t, -1, d), cos_sin)   # Q and K heads in one go
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, d)
        write_kv(kv_cache, k[:n_real], v[:n_real], attn.slot_mapping)
        o = paged_attention(q[:n_real], kv_cache, attn, self.scale, self.attn_row_multiple).view(n_real, -1)
        if n_real < t:   # padding rows (batch-invariant GEMM shapes)
            o = torch.cat([o, o.new_zeros(t - n_real, o.shape[1])])
        a = self.o_proj(o)
        if self.tp is not None:
            a = self.tp.all_reduce(a)
        x = x + a
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        m = self.down(F.silu(gate) * up)
        if self.tp is not None:
            m = self.tp.all_reduce(m)
        return x + m


def embed_and_head(cfg: ModelConfig, w: dict[str, Any], dtype: torch.dtype,
                   tp: TensorParallel | None) -> tuple[nn.Module, nn.Module]:
    """The token embedding and the LM head modules, by the tables' layout.

    GGUF blocks: a BlockEmbedding (rows dequantized on lookup) and a BlockLinear head; tied, both over
    the same bytes. Quantized (hitenter/quant; tp is None): the exact table and a rescored head. Dense:
    nn.Embedding (vocab-parallel under tp) and a Linear, packed for oneDNN where it can be (a tied
    table then stays plain for lookups)."""
    emb = w["token_embd.weight"]
    head = emb if cfg.tie_word_embeddings else w["output.weight"]
    if isinstance(emb, HeadWeight):
        return ExactEmbedding(emb.exact, dtype), RescoredHead(quant_linear(head.coarse, None, dtype), head.exact)
    if isinstance(emb, BlockWeight):
        embed: nn.Module = BlockEmbedding(emb)
    elif tp is None:
        embed = nn.Embedding.from_pretrained(emb.to(dtype), freeze=True)
    else:   # vocab-parallel: this rank's rows; looks up its own ids and all-reduces
        embed = tp.vocab_embedding(emb, dtype)
    if isinstance(head, BlockWeight):
        return embed, BlockLinear([head])
    if cfg.tie_word_embeddings:
        return embed, Linear(embed.weight, None, dtype)
    return embed, Linear(head if tp is None else tp.vocab_shard(head, dtype), None, dtype)


class LlamaModel(nn.Module):
    """Llama / Qwen2 causal LM, built from the loader's tensors (Q/K already un-permuted for llama): dense
    fp32/bf16 tensors, GGUF BlockWeights (fp32 activations) or hitenter/quant layouts, per tensor."""

    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.tp = tp
        self.embed, self.head = embed_and_head(cfg, w, dtype, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, w, i, dtype, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(w["output_norm.weight"], cfg.rms_norm_eps, dtype)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, min(cfg.context_length, 4096))
        # True: GEMM row counts padded to a multiple of 8 so results are bitwise batch invariant.
        # False: no padding (a lone decode row may then take a GEMV kernel: different bits).
        self.batch_invariant = True
        # Only dense (fp32/bf16) GEMMs need the padding: torch's int8/int4 weight-only kernels and the native
        # block kernels give a row the same bits for any row count (tests/test_quant.py,
        # tests/test_native_format.py), so such a model is invariant unpadded.
        self.dense_gemms = has_dense_gemms(self)
        self.weight_format = "dense"   # the loader names the format it built: dense, gguf, int8, int4

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        """x with its rows padded to a multiple of 8 where batch invariance needs it (see the module doc)."""
        return pad_rows(x) if self.batch_invariant and self.dense_gemms else x

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Hidden states after the final norm, `[T, H]`; writes the new tokens' K/V into kv_caches."""
        n = int(input_ids.shape[0])
        ids = self._pad(input_ids.long())
        pos = self._pad(positions.long())
        x = self.embed(ids)
        cos_sin = self.rope.table(pos, x.dtype)
        layer_ropes = [(self.rope, cos_sin)] * len(self.layers)
        return self.norm(layer_routing.run_layers(self, x, attn, kv_caches, layer_ropes, [cos_sin], n))[:n]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[N, V]` for hidden `[N, H]` (row-padded GEMM, batch invariant)."""
        n = hidden.shape[0]
        x = self._pad(hidden.to(self.dtype))
        logits = self.head(x)[:n].float()
        return logits if self.tp is None else self.tp.gather_logits(logits)

    def weight_bytes(self) -> int:
        """Resident bytes of the weights (each storage counted once; the tied head shares the embedding's)."""
        return weight_bytes(self)
