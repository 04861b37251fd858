"""The decoder every family runs: one layer class and one model class, shaped by the ModelConfig a family
file (hitenter/models/families) reads from the GGUF. PyTorch, fp32 (or bf16) activations on CPU.

The layer, in the order it computes (each step present only where the config says so):

    h = attn_norm(x)                       ("pre" and "sandwich" placement; "post" (OLMo 2): h = x)
    q, k, v = split(h Wqkv^T + b)          (one fused projection; biases: Qwen2)
    q, k = q_norm(q), k_norm(k)            (qk_norm "head": per head over D (Qwen3, Gemma 3); "full": over
                                            the whole projection (OLMo 2))
    q, k = RoPE(q, k)                      (the layer's table: global, local (Gemma 3), or none (SmolLM3))
    a = attention(q, K, V) Wo^T            (scale cfg.attn_scale, optional logit soft-cap (Gemma 2),
                                            sliding window (Gemma 2/3, Phi-3))
    x = x + residual_scale * post_attn_norm(a)     (post norm: "sandwich" and "post")
    the same around the FFN: act(h Wg^T) * (h Wu^T) Wd^T (SwiGLU, or GeGLU), or a mixture of experts
    (hitenter/models/moe.py: top-k routing, one GEMM per active expert).

The model: embeddings x embedding_scale, the layers, the final norm, the LM head, logits x logit_scale,
then the optional final soft-cap.

Contracts (as before the families): `model(input_ids [T], positions [T], attn, kv_caches) -> hidden [T, H]`
after the final norm, the new tokens' K/V written into `kv_caches` (one tensor per layer, attention.py);
`embeds=(rows [K], values [K, H])` puts `values` in place of rows' token embeddings (an image's soft
tokens; not scaled by embedding_scale, as llama.cpp's embedding batches; with cfg.deepstack_layers n,
values are [K, H x (1 + n)], models/deepstack.py); positions [T, 4] for M-RoPE families (models/mrope.py:
an image's rows and the text after it), [T] otherwise;
`model.compute_logits(hidden [N, H]) -> fp32 logits [N, V]`. Batch invariance: every op is row-wise and
dense GEMMs run on row counts padded to a multiple of 8 (quantized kernels are row-count invariant, so
such models skip the padding). Tensor parallelism (hitenter/distributed): Q/K/V and gate/up
column-parallel (`tp_shard`), o_proj and down row-parallel returning the whole output (models/shard.py:
GGUF blocks gathered, TP=1's bits; dense tensors all-reduced), experts replicated, the group supplying the
vocab-parallel embedding / head; tp=None is exactly the single-process model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.models import deepstack, layer_routing
from hitenter.models.attention import KEY_TILE, AttentionMetadata, paged_attention, write_kv
from hitenter.models.chunked_attention import chunk_view
from hitenter.models.layers import (
    RMSNorm,
    Rope,
    embed_and_head,
    finish_logits,
    fused_linear,
    has_dense_gemms,
    make_linear,
    pad_rows,
    yarn_freq_factors,
)
from hitenter.models.mrope import MRope
from hitenter.models.query_temperature import row_positions, temperature
from hitenter.models.row_invariance import attention_row_multiple
from hitenter.models.shard import TensorParallel, rank_shard, row_parallel, tp_shard
from hitenter.models.sink_attention import sink_attention
from hitenter.quant import weight_bytes

CosSin = tuple[torch.Tensor, torch.Tensor]


def _experts(cfg: ModelConfig, w: dict[str, Any], p: str) -> nn.Module:
    """The layer's mixture of experts (models/moe.py): the config's router gating, top-k by rank (chosen on
    probs + the file's `exp_probs_b.bias` where it has one), the weights times `expert_weights_scale`
    where set, the expert tensors as the loader read them (the file's blocks, or dense fp32)."""
    from hitenter.models.moe import ExpertWeight, MoEFFN, dense_experts

    def experts(name: str) -> ExpertWeight:
        t = w[p + name]
        return t if isinstance(t, ExpertWeight) else dense_experts(t)

    act = {"gelu_tanh": "gelu"}.get(cfg.activation, cfg.activation)
    biases = tuple(w.get(p + f"ffn_{n}_exps.bias") for n in ("gate", "up", "down"))
    router = w[p + "ffn_gate_inp.weight"]   # fp32 (a quantized router, where a file has one, dequantized)
    router = router if isinstance(router, torch.Tensor) else router.dequantize()
    gate = experts("ffn_gate_exps.weight") if p + "ffn_gate_exps.weight" in w else None   # None: ungated (relu2)
    return MoEFFN(router, gate, experts("ffn_up_exps.weight"),
                  experts("ffn_down_exps.weight"), cfg.num_experts_used, cfg.expert_norm_topk,
                  gating=cfg.expert_gating, act=act, router_bias=w.get(p + "ffn_gate_inp.bias"),
                  expert_bias=None if all(b is None for b in biases) else biases,
                  selection_bias=w.get(p + "exp_probs_b.bias"),
                  weights_scale=cfg.expert_weights_scale if cfg.expert_weights_scale not in (0.0, 1.0) else None,
                  weights_on_input=cfg.expert_weights_on_input)


def _row_linear(weight: Any, bias: torch.Tensor | None, dtype: torch.dtype, tp: TensorParallel | None,
                in_counts: list[int]) -> nn.Module:
    """o_proj / down: the whole weight, or under tensor parallelism its row-parallel shard taking this
    rank's `in_counts[rank]` input columns and returning the whole output (models/shard.py)."""
    return make_linear(weight, bias, dtype) if tp is None else row_parallel(weight, bias, dtype, tp, in_counts)


def _norm(w: dict[str, Any], name: str, cfg: ModelConfig, dtype: torch.dtype, present: bool) -> RMSNorm | None:
    return RMSNorm(w[name], cfg.rms_norm_eps, dtype) if present else None


class DecoderLayer(nn.Module):
    """One decoder layer of any family (see the module docstring); `window` None for a global layer."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], i: int, dtype: torch.dtype,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.cfg, self.tp, self.index = cfg, tp, i
        self.window = cfg.layer_window(i)
        self.has_rope = cfg.layer_has_rope(i)
        self.chunk = cfg.layer_chunk(i)                     # Llama 4's chunked attention (RoPE layers)
        self.qk_l2 = cfg.qk_l2_norm and self.has_rope       # Llama 4: q, k RMS-normed after RoPE
        self.q_temperature = ((cfg.attn_temperature_scale, cfg.attn_temperature_floor, cfg.attn_temperature_offset)
                              if cfg.layer_q_temperature(i) else None)
        pre, post = cfg.norm_placement != "post", cfg.norm_placement != "pre"
        self.attn_norm = _norm(w, p + "attn_norm.weight", cfg, dtype, pre)
        self.ffn_norm = _norm(w, p + "ffn_norm.weight", cfg, dtype, pre)
        self.post_attn_norm = _norm(w, p + "post_attention_norm.weight", cfg, dtype, post)
        self.post_ffw_norm = _norm(w, p + "post_ffw_norm.weight", cfg, dtype, post)
        self.qk_norm = cfg.qk_norm
        self.q_norm = _norm(w, p + "attn_q_norm.weight", cfg, dtype, cfg.qk_norm != "none")
        self.k_norm = _norm(w, p + "attn_k_norm.weight", cfg, dtype, cfg.qk_norm != "none")
        d = cfg.head_dim
        q0, self.num_heads, kv0, self.num_kv_heads, f0, f = tp_shard(cfg, tp)

        def rows(name: str, start: int, n: int) -> Any:   # this rank's output rows (whole when tp=None)
            return w[p + name].narrow(0, start, n)

        nq, nkv = self.num_heads * d, self.num_kv_heads * d
        qkv_w = [rows("attn_q.weight", q0 * d, nq), rows("attn_k.weight", kv0 * d, nkv),
                 rows("attn_v.weight", kv0 * d, nkv)]
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat([rows("attn_q.bias", q0 * d, nq), rows("attn_k.bias", kv0 * d, nkv),
                               rows("attn_v.bias", kv0 * d, nkv)])
        self.qkv = fused_linear(qkv_w, qkv_b, dtype)                             # column-parallel
        self.o_proj = _row_linear(w[p + "attn_output.weight"], w.get(p + "attn_output.bias"), dtype, tp,
                                  [rank_shard(cfg, r, tp.size)[1] * d for r in range(tp.size)] if tp else [])
        sinks = w.get(p + "attn_sinks.weight")   # gpt-oss: a logit per head in every softmax's denominator
        self.sinks = None if sinks is None else sinks.float().contiguous()
        self.moe: nn.Module | None = None
        self.shared_gate_up: nn.Module | None = None   # a shared expert beside the routed ones (Llama 4)
        if cfg.layer_has_experts(i):
            self.moe = _experts(cfg, w, p)
            if p + "ffn_up_shexp.weight" in w:
                self.shared_gate_up = fused_linear([w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"]],
                                                   None, dtype)
                self.shared_down = make_linear(w[p + "ffn_down_shexp.weight"], None, dtype)
        else:
            self.gate_up = fused_linear([rows("ffn_gate.weight", f0, f), rows("ffn_up.weight", f0, f)], None, dtype)
            self.down = _row_linear(w[p + "ffn_down.weight"], None, dtype, tp,
                                    [rank_shard(cfg, r, tp.size)[5] for r in range(tp.size)] if tp else [])
        self.q_size, self.kv_size = nq, nkv
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_logit_softcap
        self.residual_scale = cfg.residual_scale
        self.attn_row_multiple = attention_row_multiple(dtype, d, KEY_TILE)

    def forward(self, x: torch.Tensor, rope: Rope | None, cos_sin: CosSin | None, attn: AttentionMetadata,
                kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        """The layer on the step's rows: generation rows through the fused native layer where it runs
        (models/fused_decode.py), the others through `forward_torch`, the statement of the math."""
        return layer_routing.layer_forward(self, x, rope, cos_sin, attn, kv_cache, n_real)

    def qkv_heads(self, x: torch.Tensor, rope: Rope | None,
                  cos_sin: CosSin | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q `[T, NH, D]`, k and v `[T, KVH, D]` of the rows x: projected, QK-normed and rotated."""
        d = self.cfg.head_dim
        qkv = self.qkv(self.attn_norm(x) if self.attn_norm is not None else x)
        t = qkv.shape[0]
        q, k = qkv[:, :self.q_size], qkv[:, self.q_size:self.q_size + self.kv_size]
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.reshape(t, self.num_heads, d), k.reshape(t, self.num_kv_heads, d)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None and cos_sin is not None:
            q, k = rope.rotate(q, cos_sin), rope.rotate(k, cos_sin)
        if self.qk_l2:   # ggml_rms_norm over each head, no weight
            eps = self.cfg.rms_norm_eps
            q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps)
            k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps)
        return q, k, qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, d)

    def ffn(self, h: torch.Tensor, n_real: int | None = None) -> torch.Tensor:
        """The FFN on normed rows h: gated (SwiGLU / GeGLU) or the mixture of experts (which routes only
        the first n_real rows: padding rows come back zero)."""
        if self.moe is not None:
            out = self.moe(h, n_real)
            if self.shared_gate_up is not None:
                sg, su = self.shared_gate_up(h).chunk(2, dim=-1)
                out = out + self.shared_down(F.silu(sg) * su)
            return out
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.cfg.activation == "gelu_tanh" else F.silu(gate)
        return self.down(act * up)

    def _residual(self, x: torch.Tensor, y: torch.Tensor, post: RMSNorm | None) -> torch.Tensor:
        if post is not None:
            y = post(y)
        if self.residual_scale != 1.0:
            y = y * self.residual_scale
        return x + y

    def forward_torch(self, x: torch.Tensor, rope: Rope | None, cos_sin: CosSin | None, attn: AttentionMetadata,
                      kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        attn = attn.for_window(self.window)   # a local layer: its own block tables where the step has them
        if self.chunk:
            attn = chunk_view(attn, self.chunk)
        q, k, v = self.qkv_heads(x, rope, cos_sin)
        t = q.shape[0]
        if self.q_temperature is not None:   # Ministral 3, Llama 4's NoPE layers: the position's temperature
            q = q * temperature(row_positions(attn, t), *self.q_temperature).to(q.dtype)
        write_kv(kv_cache, k[:n_real], v[:n_real], attn.slot_mapping)
        if self.sinks is not None:
            o = sink_attention(q[:n_real], kv_cache, attn, self.scale, self.window, self.sinks).view(n_real, -1)
        else:
            o = paged_attention(q[:n_real], kv_cache, attn, self.scale, self.attn_row_multiple,
                                window=self.window, softcap=self.softcap).view(n_real, -1)
        if n_real < t:   # padding rows (batch-invariant GEMM shapes)
            o = torch.cat([o, o.new_zeros(t - n_real, o.shape[1])])
        x = self._residual(x, self.o_proj(o), self.post_attn_norm)
        h = self.ffn_norm(x) if self.ffn_norm is not None else x
        return self._residual(x, self.ffn(h, n_real), self.post_ffw_norm)


def rope_factors(cfg: ModelConfig, w: dict[str, Any], served_len: int) -> torch.Tensor | None:
    """The RoPE frequency factors: Llama 3's `rope_freqs`, YaRN's (computed), or LongRoPE's short factors
    when the context served is within the original one and its long factors beyond (llama.cpp's choice)."""
    if "rope_freqs.weight" in w:
        return w["rope_freqs.weight"]
    if cfg.rope_yarn_factor:
        return yarn_freq_factors(cfg.rope_dim or cfg.head_dim, cfg.rope_theta, cfg.rope_yarn_factor,
                                 cfg.rope_yarn_original_context, cfg.rope_yarn_beta_fast, cfg.rope_yarn_beta_slow)
    kind = "short" if served_len <= cfg.rope_original_context else "long"
    return w.get(f"rope_factors_{kind}.weight")


def _ropes(cfg: ModelConfig, w: dict[str, Any], max_pos: int, served_len: int) -> tuple[Rope, Rope]:
    """(the global layers' RoPE, the local layers') from the config and the file's frequency factors."""
    if cfg.rope_sections:   # M-RoPE (Qwen-VL): no factors, no scaling, no local layers
        mrope = MRope(cfg.head_dim, cfg.rope_theta, max_pos, cfg.rope_dim, cfg.rope_sections, cfg.rope_interleaved)
        return mrope, mrope
    glob = Rope(cfg.head_dim, cfg.rope_theta, max_pos, cfg.rope_dim, rope_factors(cfg, w, served_len),
                cfg.rope_scaling_factor, cfg.rope_attn_factor)
    if not cfg.sliding_window or not cfg.rope_local_theta:
        return glob, glob
    return glob, Rope(cfg.head_dim, cfg.rope_local_theta, max_pos, cfg.rope_dim)


class CausalLM(nn.Module):
    """A causal LM of any family, built from the loader's tensors (Q/K already un-permuted where the family
    stores them permuted): dense fp32/bf16 tensors, GGUF BlockWeights (fp32 activations) or hitenter/quant
    layouts, per tensor. `batch_invariant`: GEMM row counts padded to a multiple of 8 where dense GEMMs need
    it, so a row's bits never depend on the batch. `weight_format`: the format the loader built.
    `max_model_len`: the context it will serve (default the model's own), which picks LongRoPE's factors."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], dtype: torch.dtype = torch.float32,
                 tp: TensorParallel | None = None, batch_invariant: bool = True, weight_format: str = "dense",
                 max_model_len: int | None = None) -> None:
        super().__init__()
        self.config, self.dtype, self.tp = cfg, dtype, tp
        self.embed, self.head = embed_and_head(cfg, w, dtype, tp)
        # HF (Gemma): the scale rounded to the weight dtype before the multiply
        self.embed_scale = float(torch.tensor(cfg.embedding_scale, dtype=dtype))
        self.layers = nn.ModuleList(DecoderLayer(cfg, w, i, dtype, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(w["output_norm.weight"], cfg.rms_norm_eps, dtype)
        served = min(max_model_len or cfg.context_length, cfg.context_length)
        self.rope, self.rope_local = _ropes(cfg, w, min(cfg.context_length, 4096), served)
        self.batch_invariant = batch_invariant
        # only dense (fp32/bf16) GEMMs need the padding: torch's int8/int4 weight-only kernels and the native
        # block kernels give a row the same bits for any row count (tests/quant/test_quant.py, tests/models/test_formats.py)
        self.dense_gemms = has_dense_gemms(self)
        self.weight_format = weight_format

    def layer_rope(self, layer: DecoderLayer) -> Rope | None:
        """The RoPE a layer rotates with: none, the local layers' (Gemma 3) or the global one."""
        if not layer.has_rope:
            return None
        return self.rope_local if layer.window is not None else self.rope

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        """x with its rows padded to a multiple of 8 where batch invariance needs it (see the module doc)."""
        return pad_rows(x) if self.batch_invariant and self.dense_gemms else x

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[torch.Tensor],
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Hidden states after the final norm, `[T, H]`; writes the new tokens' K/V into kv_caches.
        `embeds`: (rows, values) taking the place of those rows' scaled token embeddings."""
        n = int(input_ids.shape[0])
        ids, pos = self._pad(input_ids.long()), self._pad(positions.long())
        x = self.embed(ids)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        blocks = None
        if embeds is not None:
            rows, values = embeds
            if self.config.rope_sections and positions.ndim == 1:
                raise ValueError("image rows in an M-RoPE model need [T, 4] positions (models/mrope.py "
                                 "sequence_positions); 1-D positions would place the image as text")
            if self.config.deepstack_layers:
                values, blocks = deepstack.split(values, x.shape[-1], self.config.deepstack_layers)
            x = x.index_copy(0, rows.long(), values.to(x.dtype))
        tables = {id(r): r.table(pos, x.dtype) for r in (self.rope, self.rope_local)}
        layer_ropes = []
        for layer in self.layers:
            rope = self.layer_rope(layer)
            layer_ropes.append((rope, None if rope is None else tables[id(rope)]))
        if blocks is not None:
            return self.norm(deepstack.run_layers(self, x, attn, kv_caches, layer_ropes, n, rows.long(), blocks))[:n]
        step_tables = [tables[id(self.rope)]] + ([tables[id(self.rope_local)]] if self.rope_local is not self.rope else [])
        return self.norm(layer_routing.run_layers(self, x, attn, kv_caches, layer_ropes, step_tables, n))[:n]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[N, V]` (row-padded GEMM, batch invariant), scaled and soft-capped as the family says."""
        n = hidden.shape[0]
        logits = self.head(self._pad(hidden.to(self.dtype)))[:n].float()
        if self.tp is not None:
            logits = self.tp.gather_logits(logits)
        return finish_logits(self.config, logits)

    def weight_bytes(self) -> int:
        """Resident bytes of the weights (each storage counted once; the tied head shares the embedding's)."""
        return weight_bytes(self)


def windowed_kv_bytes(cfg: ModelConfig, num_tokens: int, block_size: int, dtype_bytes: float = 4) -> tuple[int, int]:
    """(KV bytes one sequence of num_tokens holds with one block table for all layers, bytes it holds when
    each local layer keeps only the blocks its window can still reach), logged at start.

    The engine gives the local layers their own tables that release those blocks (hitenter/kv_cache/
    window_group.py, as vLLM's hybrid allocator does) unless it runs with one table (tensor parallelism,
    disaggregated prefill, HITENTER_WINDOW_RELEASE=0), where old keys are only masked."""
    per_layer_token = int(2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes)   # q8_0: 34 / 32 (kv_dtype.py)
    blocks = -(-num_tokens // block_size)
    now = held = 0
    for i in range(cfg.num_layers):
        win = cfg.layer_window(i)
        now += blocks * block_size * per_layer_token
        # the next token's window starts at num_tokens + 1 - win: blocks wholly before it are dead
        dead = 0 if win is None else max(0, num_tokens + 1 - win) // block_size
        held += (blocks - dead) * block_size * per_layer_token
    return now, held
