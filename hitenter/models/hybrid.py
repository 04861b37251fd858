"""HybridLM: the model of the hybrid families (Qwen3.5 / 3.6, Qwen3-Next, LFM2, Granite 4, Nemotron-H), whose
layers mix tokens by attention in some layers and by a recurrent state in the others.

Each layer is built from ModelConfig.layer_types[i]:

    "attention":  x = x + s * attn(attn_norm(x));  x = x + s * ffn(ffn_norm(x))
    a recurrent kind ("gated_deltanet", "short_conv", "mamba2"; MIXERS): the same with the kind's mixer
    "ffn":        x = x + s * ffn(attn_norm(x))          (Nemotron-H's FFN-only layers)

(s: ModelConfig.residual_scale; a layer whose file has no ``ffn_norm`` has no FFN part). The attention is
GQA over the paged KV cache (models/attention.py) with optional per-head QK-norm, partial NEOX RoPE (none
where the family has none: ``layer_has_rope``) and an optional sigmoid output gate (``attn_output_gate``:
the Q projection holds, per head, D query rows then D gate rows). The FFN is a gated one (SwiGLU / GeGLU),
an ungated one (``relu2``: squared ReLU), or a mixture of experts (models/moe.py) with an optional shared
expert (``ffn_*_shexp``), scaled by sigmoid(``ffn_gate_inp_shexp`` . x) where the file has that gate.

Contracts: those of decoder.CausalLM (``forward(input_ids, positions, attn, kv_caches) -> hidden [T, H]``,
``compute_logits``), with ``kv_caches[i]`` a KV tensor for an attention layer and a recurrent layer's
StateCache (models/recurrent/base.py) otherwise: ``allocate_caches`` makes that list. The step's
metadata carries each sequence's state slot (``AttentionMetadata.state_slots``); ``restore_states``
applies the restores the scheduler planned before the forward. Batch invariance holds as in CausalLM: the
projections are row-wise (dense GEMMs on rows padded to a multiple of 8), attention is the same paged
attention, and each recurrence runs per sequence (models/recurrent/base.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hitenter.config import ModelConfig
from hitenter.models.attention import (
    KEY_TILE,
    AttentionMetadata,
    allocate_kv_caches,
    paged_attention,
    write_kv,
)
from hitenter.models.decoder import _experts, rope_factors
from hitenter.models.layers import (
    RMSNorm,
    Rope,
    embed_and_head,
    finish_logits,
    fused_linear,
    has_dense_gemms,
    make_linear,
    pad_rows,
)
from hitenter.models.recurrent.base import RecurrentMixer, StateCache
from hitenter.models.recurrent.kinds import MIXERS
from hitenter.models.row_invariance import attention_row_multiple
from hitenter.models.row_ops import rowwise
from hitenter.quant import weight_bytes

CosSin = tuple[torch.Tensor, torch.Tensor]


def _mixer_class(kind: str) -> type[RecurrentMixer]:
    if kind not in MIXERS:
        raise ValueError(f"layer type {kind!r}: no recurrent mixer of that kind")
    return MIXERS[kind]


def _activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "relu2":
        return torch.relu(x).square()
    return F.silu(x)


class FFN(nn.Module):
    """The layer's feed-forward part (see the module docstring): gated, ungated, or experts (+ shared)."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], p: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = cfg.activation
        self.moe: nn.Module | None = _experts(cfg, w, p) if p + "ffn_gate_inp.weight" in w else None
        sh = "_shexp" if self.moe is not None else ""
        self.gate_up: nn.Module | None = None
        self.up: nn.Module | None = None
        self.down: nn.Module | None = None
        if p + f"ffn_down{sh}.weight" in w:
            if p + f"ffn_gate{sh}.weight" in w:
                self.gate_up = fused_linear([w[p + f"ffn_gate{sh}.weight"], w[p + f"ffn_up{sh}.weight"]], None, dtype)
            else:
                self.up = make_linear(w[p + f"ffn_up{sh}.weight"], None, dtype)
            self.down = make_linear(w[p + f"ffn_down{sh}.weight"], None, dtype)
        g = w.get(p + "ffn_gate_inp_shexp.weight")
        # a one-output Linear: a row's bits hold at any padded row count (models/linear.py), as its sigmoid's
        # do through rowwise (models/row_ops.py)
        self.shared_gate = None if g is None else make_linear(g.float().reshape(1, -1), None, torch.float32)

    def _dense(self, h: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(h).chunk(2, dim=-1)
            return self.down(_activation(self.act, gate) * up)   # type: ignore[misc]
        return self.down(_activation(self.act, self.up(h)))   # type: ignore[misc]

    def forward(self, h: torch.Tensor, n_real: int) -> torch.Tensor:
        if self.moe is None:
            return self._dense(h)
        out = self.moe(h, n_real).to(h.dtype)   # the experts compute in fp32
        if self.down is not None:
            shared = self._dense(h)
            if self.shared_gate is not None:
                shared = shared * rowwise(torch.sigmoid, self.shared_gate(h.float())).to(h.dtype)
            out = out + shared
        return out


class AttentionMixer(nn.Module):
    """GQA over the paged cache with QK-norm, partial RoPE and the output gate where the config has them."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], p: str, dtype: torch.dtype) -> None:
        super().__init__()
        d, nh, kvh = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.d, self.nh, self.kvh, self.gated = d, nh, kvh, cfg.attn_output_gate
        self.q_width = nh * d * (2 if self.gated else 1)
        self.qkv = fused_linear([w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]], None, dtype)
        self.o_proj = make_linear(w[p + "attn_output.weight"], None, dtype)
        qn, kn = w.get(p + "attn_q_norm.weight"), w.get(p + "attn_k_norm.weight")
        self.q_norm = None if qn is None else RMSNorm(qn, cfg.rms_norm_eps, dtype)
        self.k_norm = None if kn is None else RMSNorm(kn, cfg.rms_norm_eps, dtype)
        self.scale = cfg.attn_scale
        self.row_multiple = attention_row_multiple(dtype, d, KEY_TILE)

    def forward(self, h: torch.Tensor, attn: AttentionMetadata, cache: torch.Tensor, rope: Rope | None,
                cos_sin: CosSin | None, n_real: int) -> torch.Tensor:
        t, d = h.shape[0], self.d
        qkv = self.qkv(h)
        q = qkv[:, :self.q_width].reshape(t, self.nh, -1)
        gate = q[..., d:].reshape(t, -1) if self.gated else None
        q = q[..., :d]
        k = qkv[:, self.q_width:self.q_width + self.kvh * d].reshape(t, self.kvh, d)
        v = qkv[:, self.q_width + self.kvh * d:].reshape(t, self.kvh, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)   # type: ignore[misc]
        if rope is not None and cos_sin is not None:
            q, k = rope.rotate(q, cos_sin), rope.rotate(k, cos_sin)
        write_kv(cache, k[:n_real], v[:n_real], attn.slot_mapping)
        o = paged_attention(q[:n_real].contiguous(), cache, attn, self.scale, self.row_multiple).view(n_real, -1)
        if n_real < t:
            o = torch.cat([o, o.new_zeros(t - n_real, o.shape[1])])
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)


class HybridLayer(nn.Module):
    """One layer of a hybrid model (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], i: int, dtype: torch.dtype) -> None:
        super().__init__()
        p = f"blk.{i}."
        self.kind = cfg.layer_types[i]
        self.has_rope = cfg.layer_has_rope(i)
        self.norm = RMSNorm(w[p + "attn_norm.weight"], cfg.rms_norm_eps, dtype)
        self.mixer: nn.Module | None = None
        if self.kind == "attention":
            self.mixer = AttentionMixer(cfg, w, p, dtype)
        elif self.kind != "ffn":
            self.mixer = _mixer_class(self.kind)(cfg, w, p, dtype)
        fn = w.get(p + "ffn_norm.weight")
        self.ffn_norm = None if fn is None or self.mixer is None else RMSNorm(fn, cfg.rms_norm_eps, dtype)
        self.ffn = FFN(cfg, w, p, dtype) if self.ffn_norm is not None or self.mixer is None else None
        self.scale = cfg.residual_scale

    @property
    def recurrent(self) -> bool:
        return isinstance(self.mixer, RecurrentMixer)

    def _add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + (y * self.scale if self.scale != 1.0 else y)

    def forward(self, x: torch.Tensor, attn: AttentionMetadata, cache: Any, rope: Rope | None,
                cos_sin: CosSin | None, n_real: int) -> torch.Tensor:
        h = self.norm(x)
        if self.mixer is None:
            return self._add(x, self.ffn(h, n_real))   # type: ignore[misc]
        if self.recurrent:
            y = self.mixer(h, attn, cache)
        else:
            y = self.mixer(h, attn, cache, rope if self.has_rope else None, cos_sin, n_real)
        x = self._add(x, y)
        if self.ffn is None:
            return x
        return self._add(x, self.ffn(self.ffn_norm(x), n_real))   # type: ignore[misc]


class HybridLM(nn.Module):
    """A hybrid causal LM built from the loader's tensors (see the module docstring; the constructor's
    arguments are CausalLM's, without tensor parallelism)."""

    def __init__(self, cfg: ModelConfig, w: dict[str, Any], dtype: torch.dtype = torch.float32,
                 batch_invariant: bool = True, weight_format: str = "dense", max_model_len: int | None = None) -> None:
        super().__init__()
        self.config, self.dtype, self.tp = cfg, dtype, None
        self.embed, self.head = embed_and_head(cfg, w, dtype, None)
        self.embed_scale = float(torch.tensor(cfg.embedding_scale, dtype=dtype))
        self.layers = nn.ModuleList(HybridLayer(cfg, w, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(w["output_norm.weight"], cfg.rms_norm_eps, dtype)
        served = min(max_model_len or cfg.context_length, cfg.context_length)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, min(cfg.context_length, 4096), cfg.rope_dim,
                         rope_factors(cfg, w, served), cfg.rope_scaling_factor, cfg.rope_attn_factor)
        self.batch_invariant = batch_invariant
        self.dense_gemms = has_dense_gemms(self)
        self.weight_format = weight_format

    # ---- caches ------------------------------------------------------------------------------------------
    def state_shapes(self) -> list[dict[str, tuple[int, ...]] | None]:
        """Per layer: a recurrent layer's per-slot state shapes, None for the others."""
        return [layer.mixer.state_shapes() if layer.recurrent else None for layer in self.layers]

    def state_bytes_per_slot(self) -> int:
        """Bytes one sequence's state takes over all recurrent layers (float32)."""
        return sum(StateCache.bytes_per_slot(s) for s in self.state_shapes() if s is not None)

    def allocate_caches(self, num_blocks: int, block_size: int, kv_dtype: torch.dtype, num_slots: int) -> list[Any]:
        """kv_caches for the runner: a KV tensor per attention layer, a StateCache per recurrent layer (an
        FFN-only layer gets an empty tensor)."""
        kv = iter(allocate_kv_caches(self.config, num_blocks, block_size, kv_dtype, layers=[
            layer.kind == "attention" for layer in self.layers]))
        out: list[Any] = []
        for layer, shapes in zip(self.layers, self.state_shapes(), strict=True):
            if shapes is not None:
                out.append(StateCache(shapes, num_slots))
            elif layer.kind == "attention":
                out.append(next(kv))
            else:
                out.append(torch.empty(0))
        return out

    @staticmethod
    def restore_states(kv_caches: list[Any], copies: list[tuple[int, int]]) -> None:
        """Before a step: for each (src, dst), slot dst of every recurrent layer becomes slot src's state
        (src -1: zeros)."""
        for cache in kv_caches:
            if isinstance(cache, StateCache):
                for src, dst in copies:
                    if src < 0:
                        cache.zero(dst)
                    else:
                        cache.copy(src, dst)

    # ---- forward -----------------------------------------------------------------------------------------
    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        return pad_rows(x) if self.batch_invariant and self.dense_gemms else x

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[Any]) -> torch.Tensor:
        """Hidden states after the final norm, `[T, H]`; writes K/V and updates the sequences' states."""
        n = int(input_ids.shape[0])
        ids, pos = self._pad(input_ids.long()), self._pad(positions.long())
        x = self.embed(ids)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        cos_sin = self.rope.table(pos, x.dtype)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, attn, cache, self.rope, cos_sin, n)
        return self.norm(x)[:n]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[N, V]`, scaled and soft-capped as the family says."""
        n = hidden.shape[0]
        return finish_logits(self.config, self.head(self._pad(hidden.to(self.dtype)))[:n].float())

    def weight_bytes(self) -> int:
        return weight_bytes(self)
