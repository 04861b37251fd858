"""Gemma 4 (dense, and the 26B-A4B's experts): a CausalLM whose layers differ in shape, share KV and take
per-layer inputs (hitenter/models/families/gemma4.py states the file and llama.cpp's graph).

A layer, in the order it computes (x the residual stream; rms(v) = v / sqrt(mean(v^2) + eps)):

    h = attn_norm(x);  q = rope(q_norm(h Wq^T))                              (per head; the layer's RoPE)
    own KV:  k_raw = h Wk^T;  v_raw = h Wv^T, or k_raw where the layer has no Wv (K = V)
             k = rope(k_norm(k_raw)), v = rms(v_raw)  -> written to the layer's paged cache
    shared KV (the last kv_shared_layers layers): no K/V; q attends over its source layer's cache
    x = x + post_attention_norm(attention(q, K, V, scale 1) Wo^T)
    x = x + post_ffw_norm(down(gelu_tanh(gate(ffn_norm(x))) * up(ffn_norm(x))))
      (an expert layer: x + post_ffw_norm(post_ffw_norm_1(that MLP) + post_ffw_norm_2(experts(pre_ffw_norm_2(x))))
       with the router on rms(x) / sqrt(hidden) * ffn_gate_inp.scale, models/moe.py)
    per-layer input p_i (row's slice i):  x = x + post_norm(proj(gelu_tanh(inp_gate(x)) * p_i))
    x = x * layer_output_scale

The per-layer inputs of a row: (per_layer_token_embd[token] * sqrt(n) + per_layer_proj_norm(
per_layer_model_proj(x0) / sqrt(hidden))) / sqrt(2), x0 the scaled token embedding, per layer slices of n.
The token table stays on the file's map and is looked up row by row in every weight format
(models/mapped_rows.py: the loader maps it, families/gemma4.py `mapped_tables`).

Rows the engine sends to the fused layers (AttentionMetadata.kernel_rows: every row where the plan runs
prompts fused) run every layer in the C layer (models/fused_decode.py states these parts: KV read from the
source layer's cache, V = K's projection, V's plain RMS norm, the per-layer input, the output scale), when
every layer's projections are native GGUF blocks and none has experts; the others take `forward_torch`, the
statement of the math. Every op is row-wise and dense GEMMs run on rows padded to 8 as in decoder.py, so a
row's bits depend on its path (its position) alone: batch invariance holds.

Images (CausalLM ``embeds=``, the Gemma 4 vision encoder's rows): the rows take the image's values in place of
the scaled token embedding (unscaled), and their per-layer inputs are token 0's table row plus the
projection of those values (llama.cpp's embedding batches: the padding token's row). An image's
bidirectional range (AttentionMetadata.bidirectional) holds on the sliding-window layers only; the global
layers stay causal (llama.cpp's LLAMA_NON_CAUSAL_TYPE_SWA_ONLY)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.models import decode_kernel, fused_decode, layer_routing
from hitenter.models.attention import KEY_TILE, AttentionMetadata, paged_attention, write_kv
from hitenter.models.decoder import CausalLM
from hitenter.models.layers import RMSNorm, Rope, embed_and_head, fused_linear, has_dense_gemms, make_linear
from hitenter.models.mapped_rows import MappedRows
from hitenter.models.moe import ExpertWeight, MoEFFN, dense_experts
from hitenter.models.row_invariance import attention_row_multiple

CosSin = tuple[torch.Tensor, torch.Tensor]


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last dim without a weight (ggml_rms_norm)."""
    return F.rms_norm(x, (x.shape[-1],), None, eps)


def _without_kernel(attn: AttentionMetadata) -> AttentionMetadata:
    """The step's metadata with the decode kernel off (built once per step and view): for a layer whose
    shape the kernel does not take, the engine's plan having checked the first layer's. A row's path then
    depends on its layer and position only, so batch invariance holds."""
    view = attn.fused_steps.get("no_decode_kernel")  # type: ignore[call-overload]
    if view is None:
        view = dataclasses.replace(attn, use_kernel=False, _plans={}, _kernel_rows=[], fused_steps={}, _local=[])
        attn.fused_steps["no_decode_kernel"] = view  # type: ignore[index]
    return view  # type: ignore[return-value]


def _causal(attn: AttentionMetadata) -> AttentionMetadata:
    """The step's metadata without bidirectional ranges (built once per step and view): a global layer's,
    causal over an image's rows (module docstring)."""
    view = attn.fused_steps.get("causal")  # type: ignore[call-overload]
    if view is None:
        view = dataclasses.replace(attn, bidirectional=None, _plans={}, _kernel_rows=[], fused_steps={}, _local=[])
        attn.fused_steps["causal"] = view  # type: ignore[index]
    return view  # type: ignore[return-value]


class Gemma4Layer(nn.Module):
    """One Gemma 4 layer (module docstring): its own head size, KV heads, FFN width and KV source."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], i: int, dtype: torch.dtype) -> None:
        super().__init__()
        p, eps = f"blk.{i}.", cfg.rms_norm_eps
        self.cfg, self.index, self.eps = cfg, i, eps
        self.window = cfg.layer_window(i)
        self.has_rope = True
        self.head_dim, self.num_heads, self.num_kv_heads = cfg.layer_head_dim(i), cfg.num_heads, cfg.layer_kv_heads(i)
        self.own_kv = cfg.layer_kv_source(i) == i
        self.scale, self.residual_scale, self.softcap, self.sinks = 1.0, 1.0, None, None   # the fused layer's view
        self.k_norm: RMSNorm | None = None

        def norm(name: str) -> RMSNorm:
            return RMSNorm(w[p + name + ".weight"], eps, dtype)

        self.attn_norm, self.q_norm = norm("attn_norm"), norm("attn_q_norm")
        self.post_attn_norm, self.ffn_norm, self.post_ffw_norm = (norm("post_attention_norm"), norm("ffn_norm"),
                                                                  norm("post_ffw_norm"))
        parts = [w[p + "attn_q.weight"]]
        self.v_from_k = False
        if self.own_kv:
            self.k_norm = norm("attn_k_norm")
            parts.append(w[p + "attn_k.weight"])
            self.v_from_k = p + "attn_v.weight" not in w
            if not self.v_from_k:
                parts.append(w[p + "attn_v.weight"])
        self.qkv = fused_linear(parts, None, dtype)
        self.o_proj = make_linear(w[p + "attn_output.weight"], None, dtype)
        self.gate_up = fused_linear([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]], None, dtype)
        self.down = make_linear(w[p + "ffn_down.weight"], None, dtype)
        self.per_layer = cfg.per_layer_input_size > 0
        if self.per_layer:
            self.inp_gate = make_linear(w[p + "inp_gate.weight"], None, dtype)
            self.ple_proj = make_linear(w[p + "proj.weight"], None, dtype)
            self.ple_norm = norm("post_norm")
        self.moe: MoEFFN | None = None
        if p + "ffn_gate_inp.weight" in w:
            self._experts(cfg, w, p, dtype)
        self.torch_only = self.moe is not None   # the experts beside the dense MLP: not in the C layer
        scale = w.get(p + "layer_output_scale.weight")
        self.out_scale = 1.0 if scale is None else float(scale.reshape(-1)[0])
        self.attn_row_multiple = attention_row_multiple(dtype, self.head_dim, KEY_TILE)

    def _experts(self, cfg: ModelConfig, w: dict[str, Any], p: str, dtype: torch.dtype) -> None:
        """The expert branch (module docstring): its norms, router scale and MoEFFN."""
        def experts(name: str) -> ExpertWeight:
            t = w[p + name]
            return t if isinstance(t, ExpertWeight) else dense_experts(t)

        router = w[p + "ffn_gate_inp.weight"]
        router = router if isinstance(router, torch.Tensor) else router.dequantize()
        self.moe = MoEFFN(router, experts("ffn_gate_exps.weight"), experts("ffn_up_exps.weight"),
                          experts("ffn_down_exps.weight"), cfg.num_experts_used, True, gating="softmax", act="gelu",
                          expert_scale=w.get(p + "ffn_down_exps.scale"))
        self.router_scale = w[p + "ffn_gate_inp.scale"].float().reshape(-1) / math.sqrt(cfg.hidden_size)
        self.pre_norm_2 = RMSNorm(w[p + "pre_ffw_norm_2.weight"], self.eps, dtype)
        self.post_norm_1 = RMSNorm(w[p + "post_ffw_norm_1.weight"], self.eps, dtype)
        self.post_norm_2 = RMSNorm(w[p + "post_ffw_norm_2.weight"], self.eps, dtype)

    def forward(self, x: torch.Tensor, ple: torch.Tensor | None, rope: Rope, cos_sin: CosSin,
                attn: AttentionMetadata, kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        return self.forward_torch(x, ple, rope, cos_sin, attn, kv_cache, n_real)

    def forward_torch(self, x: torch.Tensor, ple: torch.Tensor | None, rope: Rope, cos_sin: CosSin,
                      attn: AttentionMetadata, kv_cache: torch.Tensor, n_real: int) -> torch.Tensor:
        """The layer on the step's rows x `[T, H]` (ple: this layer's per-layer inputs `[T, n]` or None), the
        statement of the math (the fused C layer, models/fused_decode.py, is compared with it)."""
        attn = attn.for_window(self.window) if self.window is not None or not attn.bidirectional else _causal(attn)
        t, d, nh, kvh = x.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        qkv = self.qkv(self.attn_norm(x))
        q = rope.rotate(self.q_norm(qkv[:, :nh * d].reshape(t, nh, d)), cos_sin)
        if self.own_kv:
            k_raw = qkv[:, nh * d:(nh + kvh) * d].reshape(t, kvh, d)
            v_raw = k_raw if self.v_from_k else qkv[:, (nh + kvh) * d:].reshape(t, kvh, d)
            k = rope.rotate(self.k_norm(k_raw), cos_sin)
            write_kv(kv_cache, k[:n_real], _rms(v_raw, self.eps)[:n_real], attn.slot_mapping)
        if attn.use_kernel and not decode_kernel.supports(kv_cache, nh, q.dtype):
            attn = _without_kernel(attn)   # e.g. the global layers' 512-wide heads: every row on the GEMM path
        o = paged_attention(q[:n_real], kv_cache, attn, 1.0, self.attn_row_multiple,
                            window=self.window).view(n_real, -1)
        if n_real < t:   # padding rows (batch-invariant GEMM shapes)
            o = torch.cat([o, o.new_zeros(t - n_real, o.shape[1])])
        x = x + self.post_attn_norm(self.o_proj(o))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        y = self.down(F.gelu(gate, approximate="tanh") * up)
        if self.moe is not None:
            r = _rms(x, self.eps) * self.router_scale
            y = self.post_norm_1(y) + self.post_norm_2(self.moe(self.pre_norm_2(x), n_real, router_x=r))
        x = x + self.post_ffw_norm(y)
        if ple is not None:
            g = F.gelu(self.inp_gate(x), approximate="tanh") * ple
            x = x + self.ple_norm(self.ple_proj(g))
        return x * self.out_scale if self.out_scale != 1.0 else x


class Gemma4LM(CausalLM):
    """A Gemma 4 model (module docstring) with CausalLM's interface: forward(ids, positions, attn, kv_caches)
    -> hidden after the final norm, compute_logits (final soft-cap). kv_caches: one per layer, a KV-shared
    layer's the same tensor as its source's (attention.allocate_kv_caches). Not traceable by the playground
    (models/trace.py runs decoder layers)."""

    traceable = False

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], dtype: torch.dtype = torch.float32,
                 batch_invariant: bool = True, weight_format: str = "dense", max_model_len: int | None = None) -> None:
        nn.Module.__init__(self)
        self.config, self.dtype, self.tp = cfg, dtype, None
        self.embed, self.head = embed_and_head(cfg, w, dtype, None)
        self.embed_scale = float(torch.tensor(cfg.embedding_scale, dtype=dtype))
        self.layers = nn.ModuleList(Gemma4Layer(cfg, w, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(w["output_norm.weight"], cfg.rms_norm_eps, dtype)
        max_pos = min(cfg.context_length, 4096)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, max_pos, cfg.rope_dim, w.get("rope_freqs.weight"))
        swa_dim = cfg.head_dim_swa or cfg.head_dim
        self.rope_local = Rope(swa_dim, cfg.rope_local_theta or cfg.rope_theta, max_pos,
                               0 if cfg.rope_dim_swa in (0, swa_dim) else cfg.rope_dim_swa)
        self.ple_size = cfg.per_layer_input_size
        if self.ple_size:
            self.ple_table = MappedRows(w["per_layer_token_embd.weight"])
            self.ple_model_proj = make_linear(w["per_layer_model_proj.weight"], None, dtype)
            self.ple_proj_norm = RMSNorm(w["per_layer_proj_norm.weight"], cfg.rms_norm_eps, dtype)
        for layer in self.layers:   # the dims its RoPE table rotates (the fused layer reads the table's width)
            layer.rope_dim = self.layer_rope(layer).rope_dim
        self.batch_invariant = batch_invariant
        self.dense_gemms = has_dense_gemms(self)
        self.layers_dense = any(has_dense_gemms(layer) for layer in self.layers)   # else the C layers may run them
        self.weight_format = weight_format

    def per_layer_inputs(self, ids: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """`[T, layers, n]`: each row's per-layer inputs from its token and its scaled embedding x0."""
        t, n, nl = ids.shape[0], self.ple_size, self.config.num_layers
        tok = self.ple_table(ids).to(x0.dtype).view(t, nl, n) * math.sqrt(n)
        proj = self.ple_model_proj(x0) * (1.0 / math.sqrt(self.config.hidden_size))
        proj = self.ple_proj_norm(proj.view(t, nl, n))
        return (proj + tok) * (1.0 / math.sqrt(2.0))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[torch.Tensor],
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Hidden states after the final norm, `[T, H]`; writes the new tokens' K/V into kv_caches. `embeds`:
        (rows, values) taking the place of those rows' scaled token embeddings (module docstring: images)."""
        n = int(input_ids.shape[0])
        ids, pos = self._pad(input_ids.long()), self._pad(positions.long())
        x = self.embed(ids)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        table_ids = ids
        if embeds is not None:
            rows, values = embeds[0].long(), embeds[1]
            if values.ndim != 2 or values.shape[1] != x.shape[1] or values.shape[0] != rows.shape[0]:
                raise ValueError(f"gemma4: image rows {tuple(values.shape)} for {rows.shape[0]} rows of width "
                                 f"{x.shape[1]}")
            x = x.index_copy(0, rows, values.to(x.dtype))
            table_ids = ids.index_fill(0, rows, 0)
        ple = self.per_layer_inputs(table_ids, x) if self.ple_size else None
        tables = {id(r): r.table(pos, x.dtype) for r in (self.rope, self.rope_local)}
        fused = None if self.layers_dense else fused_decode.all_fused(self, attn, kv_caches)
        kr = attn.kernel_rows(layer_routing.global_cache(self, kv_caches).shape[2]) if fused is not None else None
        if kr is not None:   # the layers' GEMMs are row invariant: the padding rows (head, table projection) dropped
            x, ple = x[:n], None if ple is None else ple[:n]
            tables = {k: (c[:n], s[:n]) for k, (c, s) in tables.items()}
            return self.norm(self._split(x, ple, tables, attn, kv_caches, fused, kr))   # type: ignore[arg-type]
        return self.norm(self._torch_layers(x, ple, tables, attn, kv_caches, n))[:n]

    def _torch_layers(self, x: torch.Tensor, ple: torch.Tensor | None, tables: dict[int, CosSin],
                      attn: AttentionMetadata, kv_caches: list[torch.Tensor], n: int) -> torch.Tensor:
        """Every layer's torch statement on the rows x (n real rows; tables: each RoPE's cos/sin by id)."""
        for i, (layer, cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            rope = self.layer_rope(layer)
            x = layer.forward_torch(x, None if ple is None else ple[:, i], rope, tables[id(rope)], attn, cache, n)
        return x

    def _split(self, x: torch.Tensor, ple: torch.Tensor | None, tables: dict[int, CosSin], attn: AttentionMetadata,
               kv_caches: list[torch.Tensor], fused: list[fused_decode.FusedLayer],
               kr: decode_kernel.KernelRows) -> torch.Tensor:
        """A step with fused rows `kr` (layer_routing.split_forward's order): the other rows through the torch
        layers first (their K/V written), then the fused rows through every C layer in one call."""
        step_tables = [tables[id(self.rope)], tables[id(self.rope_local)]]
        if kr.all_rows:
            return fused_decode.run_all_layers(self, x, attn, step_tables, kv_caches, fused, kr, ple)
        rows, meta = layer_routing.gemm_only(attn)
        sub = {k: (c.index_select(0, rows), s.index_select(0, rows)) for k, (c, s) in tables.items()}
        out = torch.empty_like(x)
        xg = self._torch_layers(x.index_select(0, rows), None if ple is None else ple.index_select(0, rows), sub,
                                meta, kv_caches, len(rows))
        out.index_copy_(0, rows, xg)
        gen = fused_decode.run_all_layers(self, x.index_select(0, kr.rows), attn, step_tables, kv_caches, fused, kr,
                                          None if ple is None else ple.index_select(0, kr.rows))
        out.index_copy_(0, kr.rows, gen)
        return out
