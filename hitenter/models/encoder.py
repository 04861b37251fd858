"""The encoder every bidirectional family runs (bert, nomic-bert, nomic-bert-moe, gemma-embedding): sequences packed one
after another without padding, each attending to all of its own tokens (no causal mask, no KV cache kept),
then pooled (models/pooling.py). PyTorch, fp32 (or bf16) activations on CPU, built from the loader's tensors
by llama.cpp's names (src/models/bert.cpp, gemma-embedding.cpp).

    x = token_embd[ids] (x embedding_scale) (+ token_types[0]) (+ position_embd[pos])  (BERT: absolute positions;
                                                                              every token is "sentence A")
    x = LayerNorm(x, token_embd_norm)                       (where the file has it)
    per layer, norm_placement "post_residual" (BERT, nomic-bert; LayerNorms):
        x = LN(x + attn(x), attn_output_norm);  x = LN(x + ffn(x), layer_output_norm)
    or "sandwich" (EmbeddingGemma; RMSNorms, QK-norm per head):
        x = x + rms(attn(rms(x)));  x = x + rms(ffn(rms(x)))
    attn: q, k, v from attn_q/k/v (+ biases) or the fused attn_qkv; RoPE (NEOX) where the family rotates;
          softmax(scale q.k) v over the sequence's keys (a local layer's symmetric window: |i - j| <= window/2)
    ffn:  down(act(gate(x)) * up(x)) where the file has ffn_gate (SwiGLU, GeGLU), else down(act(up(x) + b) + b);
          on a mixture-of-experts layer (nomic-bert-moe) models/moe.py's MoEFFN with the config's routing
    hidden = rms(x, output_norm) where the file has output_norm

Contract: `model(ids [T], lengths)` -> the final hidden rows `[T, H]` of the packed sequences;
`model.embed_sequences(seqs)` -> `[len(seqs), out]` pooled by the file's pooling (not normalized). A row's value
depends only on its own sequence.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.kernels import BlockWeight
from hitenter.models.block_linear import BlockEmbedding
from hitenter.models.layers import LayerNorm, RMSNorm, Rope, fused_linear, make_linear
from hitenter.models.moe import ExpertWeight, MoEFFN, dense_experts
from hitenter.models.pooling import Pooler
from hitenter.quant import ExactEmbedding, HeadWeight, weight_bytes


def _dense(t: Any) -> torch.Tensor:
    return t if isinstance(t, torch.Tensor) else t.dequantize()


class EncoderLayer(nn.Module):
    """One bidirectional layer (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], i: int, dtype: torch.dtype) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.cfg, self.window = cfg, cfg.layer_window(i)
        d, nq, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.q_size, self.kv_size = nq * d, nkv * d
        if p + "attn_qkv.weight" in w:
            self.qkv = make_linear(w[p + "attn_qkv.weight"], w.get(p + "attn_qkv.bias"), dtype)
        else:
            names = ("attn_q", "attn_k", "attn_v")
            biases = [w.get(p + n + ".bias") for n in names]
            bias = None if all(b is None for b in biases) else torch.cat([
                b if b is not None else torch.zeros(n) for b, n in
                zip(biases, (self.q_size, self.kv_size, self.kv_size), strict=True)])
            self.qkv = fused_linear([w[p + n + ".weight"] for n in names], bias, dtype)
        self.o_proj = make_linear(w[p + "attn_output.weight"], w.get(p + "attn_output.bias"), dtype)
        self.gated = p + "ffn_gate.weight" in w
        self.moe = _experts(cfg, w, p) if cfg.layer_has_experts(i) else None
        if self.moe is None:
            self._dense_ffn(w, p, dtype)
        self.post_residual = cfg.norm_placement == "post_residual"
        if self.post_residual:
            self.attn_out_norm = _layer_norm(w, p + "attn_output_norm", cfg, dtype)
            self.out_norm = _layer_norm(w, p + "layer_output_norm", cfg, dtype)
        else:
            self.norms = nn.ModuleDict({n: RMSNorm(w[p + n + ".weight"], cfg.rms_norm_eps, dtype) for n in (
                "attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm") if p + n + ".weight" in w})
        self.q_norm = self.k_norm = None
        if p + "attn_q_norm.weight" in w:
            self.q_norm = RMSNorm(w[p + "attn_q_norm.weight"], cfg.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(w[p + "attn_k_norm.weight"], cfg.rms_norm_eps, dtype)
        self.scale = cfg.attn_scale

    def _dense_ffn(self, w: dict[str, Any], p: str, dtype: torch.dtype) -> None:
        if self.gated:
            self.gate_up = fused_linear([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]], None, dtype)
        else:
            self.up = make_linear(w[p + "ffn_up.weight"], w.get(p + "ffn_up.bias"), dtype)
        self.down = make_linear(w[p + "ffn_down.weight"], w.get(p + "ffn_down.bias"), dtype)

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.norms[name](x) if name in self.norms else x

    def forward(self, x: torch.Tensor, rope: Rope | None, cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
                lengths: list[int]) -> torch.Tensor:
        if self.post_residual:
            x = self.attn_out_norm(x + self.attention(x, rope, cos_sin, lengths))
            return self.out_norm(x + self.ffn(x))
        x = x + self._norm("post_attention_norm", self.attention(self._norm("attn_norm", x), rope, cos_sin, lengths))
        return x + self._norm("post_ffw_norm", self.ffn(self._norm("ffn_norm", x)))

    def attention(self, h: torch.Tensor, rope: Rope | None, cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
                  lengths: list[int]) -> torch.Tensor:
        """Self-attention of each sequence over its own rows, then the output projection."""
        cfg, t = self.cfg, h.shape[0]
        qkv = self.qkv(h)
        q = qkv[:, :self.q_size].reshape(t, cfg.num_heads, cfg.head_dim)
        k = qkv[:, self.q_size:self.q_size + self.kv_size].reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, self.q_size + self.kv_size:].reshape(t, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None and cos_sin is not None:
            q, k = rope.rotate(q, cos_sin), rope.rotate(k, cos_sin)
        out = torch.empty_like(q)
        for idx, n in _by_length(lengths):
            out[idx] = self._attend(q[idx], k[idx], v[idx], n)
        return self.o_proj(out.reshape(t, -1))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int) -> torch.Tensor:
        """Attention of B sequences of n rows each, given as `[B * n, heads, D]` rows (sequence-major)."""
        b = q.shape[0] // n
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        qh = q.reshape(b, n, -1, q.shape[-1]).transpose(1, 2)
        kh = k.reshape(b, n, -1, k.shape[-1]).transpose(1, 2).repeat_interleave(group, dim=1)
        vh = v.reshape(b, n, -1, v.shape[-1]).transpose(1, 2).repeat_interleave(group, dim=1)
        mask = None
        if self.window is not None:     # a symmetric window: keys within window // 2 on either side
            pos = torch.arange(n)
            mask = (pos[:, None] - pos[None, :]).abs() <= self.window // 2
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=self.scale)
        return o.transpose(1, 2).reshape(b * n, -1, q.shape[-1])

    def ffn(self, h: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe(h.float()).to(h.dtype)
        act = (lambda y: F.gelu(y, approximate="tanh")) if self.cfg.activation == "gelu_tanh" else F.silu
        if self.gated:
            gate, up = self.gate_up(h).chunk(2, dim=-1)
            return self.down(act(gate) * up)
        return self.down(act(self.up(h)))


def _experts(cfg: ModelConfig, w: dict[str, Any], p: str) -> MoEFFN:
    """A mixture-of-experts FFN of ungated experts (nomic-bert-moe): the config's router gating and top-k,
    the expert tensors as the loader read them (the file's blocks, or dense fp32)."""
    def experts(name: str) -> ExpertWeight:
        t = w[p + name]
        return t if isinstance(t, ExpertWeight) else dense_experts(t)

    router = _dense(w[p + "ffn_gate_inp.weight"]).float()
    act = {"gelu_tanh": "gelu"}.get(cfg.activation, cfg.activation)
    scale = cfg.expert_weights_scale if cfg.expert_weights_scale not in (0.0, 1.0) else None
    return MoEFFN(router, None, experts("ffn_up_exps.weight"), experts("ffn_down_exps.weight"),
                  cfg.num_experts_used, cfg.expert_norm_topk, gating=cfg.expert_gating, act=act, weights_scale=scale)


def _embedding(table: Any, dtype: torch.dtype) -> nn.Module:
    """The token embedding by the table's layout: GGUF blocks (rows dequantized on lookup), hitenter/quant's
    exact table, or a dense nn.Embedding."""
    if isinstance(table, BlockWeight):
        return BlockEmbedding(table)
    if isinstance(table, HeadWeight):
        return ExactEmbedding(table.exact, dtype)
    return nn.Embedding.from_pretrained(_dense(table).to(dtype), freeze=True)


def _layer_norm(w: dict[str, Any], name: str, cfg: ModelConfig, dtype: torch.dtype) -> LayerNorm:
    return LayerNorm(_dense(w[name + ".weight"]), w.get(name + ".bias"), cfg.rms_norm_eps, dtype)


def _by_length(lengths: list[int]) -> list[tuple[torch.Tensor, int]]:
    """(row indices, length) of the packed sequences grouped by length, sequence-major within a group."""
    starts, groups = 0, {}
    for n in lengths:
        groups.setdefault(n, []).append(torch.arange(starts, starts + n))
        starts += n
    return [(torch.cat(rows), n) for n, rows in groups.items()]


class EncoderModel(nn.Module):
    """A bidirectional encoder of any encoder family (see the module docstring) with its Pooler."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], dtype: torch.dtype = torch.float32,
                 weight_format: str = "dense") -> None:
        super().__init__()
        self.config, self.dtype, self.weight_format = cfg, dtype, weight_format
        self.embed = _embedding(w["token_embd.weight"], dtype)
        self.type_row = None if "token_types.weight" not in w else _dense(w["token_types.weight"])[0].to(dtype)
        self.pos_embd = None if "position_embd.weight" not in w else _dense(w["position_embd.weight"]).to(dtype)
        self.embd_norm = (_layer_norm(w, "token_embd_norm", cfg, dtype) if "token_embd_norm.weight" in w else None)
        self.embed_scale = float(torch.tensor(cfg.embedding_scale, dtype=torch.float32))
        self.layers = nn.ModuleList(EncoderLayer(cfg, w, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(w["output_norm.weight"], cfg.rms_norm_eps, dtype) if "output_norm.weight" in w else None
        self.rope = self.rope_local = None
        if cfg.use_rope:
            ctx = min(cfg.context_length, 4096)
            self.rope = Rope(cfg.head_dim, cfg.rope_theta, ctx, cfg.rope_dim)
            self.rope_local = Rope(cfg.head_dim, cfg.rope_local_theta, ctx, cfg.rope_dim) \
                if cfg.rope_local_theta and cfg.sliding_window else self.rope
        self.pooler = Pooler(cfg, w)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The final hidden rows `[T, H]` of the packed sequences (`lengths` rows each, in order)."""
        if sum(lengths) != int(input_ids.shape[0]) or min(lengths, default=1) < 1:
            raise ValueError(f"lengths {lengths} do not cover the {int(input_ids.shape[0])} input rows")
        if max(lengths) > self.config.context_length:
            raise ValueError(f"a sequence of {max(lengths)} tokens exceeds the model's context "
                             f"{self.config.context_length}")
        positions = torch.cat([torch.arange(n) for n in lengths])
        x = self.embed(input_ids.long())
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        if self.type_row is not None:
            x = x + self.type_row
        if self.pos_embd is not None:
            x = x + self.pos_embd[positions]
        if self.embd_norm is not None:
            x = self.embd_norm(x)
        tables = {id(r): r.table(positions, x.dtype) for r in (self.rope, self.rope_local) if r is not None}
        for layer in self.layers:
            rope = self.rope_local if layer.window is not None else self.rope
            x = layer(x, rope, None if rope is None else tables[id(rope)], lengths)
        return self.norm(x) if self.norm is not None else x

    @torch.inference_mode()
    def embed_sequences(self, seqs: list[list[int]]) -> torch.Tensor:
        """The pooled vectors `[len(seqs), out]` of token sequences (one forward; not normalized)."""
        lengths = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
        return self.pooler(self(ids, lengths), lengths)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """An encoder has no LM head: ValueError (the engine refuses generation before it gets here)."""
        raise ValueError(f"model: {self.config.architecture} is an embedding model; it does not generate text")

    def weight_bytes(self) -> int:
        """Resident bytes of the weights (each storage counted once)."""
        return int(weight_bytes(self)) + sum(t.numel() * t.element_size() for t in (
            self.type_row, self.pos_embd) if t is not None)
