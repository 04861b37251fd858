"""What every family shares: reading the common GGUF hyper-parameters, the tensors a config needs, and the
load-time preparation of the file's tensors into the names the decoder reads (hitenter/models/decoder.py).

A family (one file beside this one) subclasses `Family` and states only what differs from Llama:
its `arch` (general.architecture), whether convert_hf_to_gguf stored Q/K permuted for llama.cpp's
interleaved (NORM) RoPE, the config fields it reads (`fields`), and, where its file holds tensors under
other names (Phi-3's fused QKV), `file_shapes` / `prepare`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError


@dataclass(frozen=True)
class Meta:
    """A GGUF file's metadata seen from one architecture: `get("context_length")` reads `{arch}.context_length`."""

    values: dict[str, Any]
    arch: str
    read: list[str] = field(default_factory=list, compare=False, repr=False)   # keys looked up, in order

    def get(self, key: str, default: Any = None) -> Any:
        self.read.append(f"{self.arch}.{key}")
        return self.values.get(f"{self.arch}.{key}", default)

    def require(self, key: str) -> Any:
        full = f"{self.arch}.{key}"
        self.read.append(full)
        if full not in self.values:
            raise ModelLoadError(f"GGUF metadata is missing the required key {full!r}")
        return self.values[full]


def unpermute_qk(w: Any, n_head: int) -> Any:
    """Undo convert_hf_to_gguf's llama Q/K permutation (interleaved -> rotate-half row order); a quantized
    layout (BlockWeight, hitenter/quant) gets the same row order by index."""
    if isinstance(w, torch.Tensor):
        dim = w.shape[0] // n_head // 2
        return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return w.index_rows(unpermute_qk(torch.arange(w.shape[0]), n_head))


class Family:
    """The Llama defaults; a family file overrides what its architecture does differently."""

    arch = "llama"
    permuted_qk = False      # llama.cpp NORM-rope families: Q/K rows stored interleaved (un-permuted at load)
    mapped_tables: tuple[str, ...] = ()   # tensors looked up by rows on the file's map (models/mapped_rows.py)

    def fields(self, meta: Meta, cfg: dict[str, Any], names: set[str]) -> dict[str, Any]:
        """The family's ModelConfig fields beyond the common ones (`cfg`: those, already read)."""
        return {}

    def config(self, values: dict[str, Any], names: set[str] | None) -> ModelConfig:
        """The ModelConfig of a file with this metadata (and tensor names, which decide tied heads and
        biases; without them, untied with no biases is assumed). ModelLoadError names what is wrong: a
        missing key, a value of the wrong type or range (the key last read), a layer count beyond
        MAX_LAYERS."""
        meta = Meta(values, self.arch)
        try:
            base = common_fields(meta, names)
            check_layer_count(meta, base["num_layers"])
            base.update(self.fields(meta, base, names or set()))
        except ModelLoadError:
            raise
        except (TypeError, ValueError, ArithmeticError, AttributeError, IndexError, KeyError) as e:
            raise wrong_value(meta, e) from e
        try:
            return ModelConfig(**base)
        except ValueError as e:
            raise ModelLoadError(f"GGUF metadata describes an invalid model: {e}") from e

    def file_shapes(self, cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
        """Torch-order shape of every tensor the file must hold (`names`: what it does hold, for the
        optional ones such as `rope_freqs.weight`)."""
        return standard_shapes(cfg, names)

    def prepare(self, w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
        """The file's tensors under the decoder's names, Q/K in rotate-half row order."""
        if self.permuted_qk:
            for i in range(cfg.num_layers):
                w[f"blk.{i}.attn_q.weight"] = unpermute_qk(w[f"blk.{i}.attn_q.weight"], cfg.num_heads)
                w[f"blk.{i}.attn_k.weight"] = unpermute_qk(w[f"blk.{i}.attn_k.weight"], cfg.num_kv_heads)
        return w


MAX_LAYERS = 4096    # far beyond any released model; a larger block_count is damage, not a model


def check_layer_count(meta: Meta, n: int) -> None:
    """ModelLoadError unless block_count is in 1..MAX_LAYERS, so nothing is sized by a hostile count."""
    if not 0 < n <= MAX_LAYERS:
        raise ModelLoadError(f"GGUF metadata key '{meta.arch}.block_count' is {n}, outside 1..{MAX_LAYERS}")


def wrong_value(meta: Meta, e: Exception) -> ModelLoadError:
    """The error for a value a family could not read: the key it read last, its value and the reason."""
    key = meta.read[-1] if meta.read else f"{meta.arch}.*"
    shown = repr(meta.values.get(key))
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
    return ModelLoadError(f"GGUF metadata key {key!r} has a value of the wrong type or range ({shown}): {reason}")


def common_fields(meta: Meta, names: set[str] | None) -> dict[str, Any]:
    """The hyper-parameters every family reads, llama.cpp's keys and defaults."""
    hidden = int(meta.require("embedding_length"))
    heads = int(meta.require("attention.head_count"))
    head_dim = int(meta.get("attention.key_length", 0)) or hidden // max(heads, 1)
    vocab = meta.get("vocab_size")
    if vocab is None:
        tokens = meta.values.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ModelLoadError("GGUF metadata is missing the required key 'tokenizer.ggml.tokens'")
        vocab = len(tokens)
    rope_dim = int(meta.get("rope.dimension_count", head_dim))
    return dict(
        architecture=meta.arch, vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=largest(meta.require("feed_forward_length")), num_layers=int(meta.require("block_count")),
        num_heads=heads, num_kv_heads=largest(meta.get("attention.head_count_kv", heads)), head_dim=head_dim,
        rope_theta=float(meta.get("rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta.require("attention.layer_norm_rms_epsilon")),
        context_length=int(meta.require("context_length")),
        tie_word_embeddings=names is not None and "output.weight" not in names,
        attention_bias=names is not None and "blk.0.attn_q.bias" in names,
        name=str(meta.values.get("general.name", "")),
        rope_dim=0 if rope_dim == head_dim else rope_dim,
        rope_scaling_factor=linear_rope_factor(meta),
        causal=bool(meta.get("attention.causal", True)),
        pooling=pooling_name(meta),
        **yarn_fields(meta),
    )


POOLING_TYPES = ("none", "mean", "cls", "last", "rank")    # llama.cpp's llama_pooling_type 0..4


def pooling_name(meta: Meta) -> str:
    """`{arch}.pooling_type` by name ("" where the file does not say); ModelLoadError for an unknown one."""
    value = meta.get("pooling_type")
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(POOLING_TYPES):
        raise ModelLoadError(f"GGUF metadata key '{meta.arch}.pooling_type' is {value!r}; llama.cpp's pooling "
                             f"types are 0..4 ({', '.join(POOLING_TYPES)})")
    return POOLING_TYPES[value]


def largest(value: Any) -> int:
    """A hyper-parameter that llama.cpp reads per layer (get_key_or_arr): one value, or an array whose largest
    entry is the model's (hybrid files write 0 for the layers without that part)."""
    return max(int(v) for v in value) if isinstance(value, list | tuple) else int(value)


def per_layer(meta: Meta, key: str, n: int, default: int = 0) -> list[int]:
    """`key` for each of n layers: the file's array (ModelLoadError unless it has n entries), or its one
    value repeated (`default` where absent)."""
    value = meta.get(key, default)
    if not isinstance(value, list | tuple):
        return [int(value)] * n
    if len(value) != n:
        raise ModelLoadError(f"GGUF metadata {meta.arch}.{key} has {len(value)} entries for {n} layers")
    return [int(v) for v in value]


def linear_rope_factor(meta: Meta, allowed: tuple[str, ...] = ()) -> float:
    """The linear RoPE scaling factor (1: none). Other scaling types are refused at load, naming the
    type, unless handled elsewhere (YaRN: `yarn_fields`; `allowed`: e.g. Llama 3's, carried by
    `rope_freqs`)."""
    kind = meta.get("rope.scaling.type")
    if kind in (None, "none", "yarn") or kind in allowed:
        return 1.0
    if kind != "linear":
        raise ModelLoadError(f"{meta.arch}: RoPE scaling type {kind!r} is not supported (linear, yarn and "
                             "Llama 3's rope_freqs are)")
    return float(meta.get("rope.scaling.factor", 1.0)) or 1.0


def yarn_fields(meta: Meta) -> dict[str, Any]:
    """YaRN scaling (rope.scaling.type "yarn"): its factor, original context and betas (llama.cpp's
    defaults 32 / 1), and the attention factor cos/sin are multiplied by: ggml's 1 + 0.1 ln(factor), or
    with `rope.scaling.yarn_log_multiplier` m (Ministral 3's mscale_all_dim) llama.cpp's
    (1 + 0.1 ln f) / (1 + 0.1 m ln f) (llama_context: get_mscale(f, 1) / get_mscale(f, m))."""
    if meta.get("rope.scaling.type") != "yarn":
        return {}
    factor = float(meta.get("rope.scaling.factor", 1.0)) or 1.0
    attn_factor = 1.0 + 0.1 * math.log(factor) if factor > 1.0 else 1.0
    log_mul = float(meta.get("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    if log_mul and factor > 1.0:
        attn_factor /= 1.0 + 0.1 * log_mul * math.log(factor)
    return {"rope_yarn_factor": factor,
            "rope_yarn_original_context": int(meta.require("rope.scaling.original_context_length")),
            "rope_yarn_beta_fast": float(meta.get("rope.scaling.yarn_beta_fast", 32.0)),
            "rope_yarn_beta_slow": float(meta.get("rope.scaling.yarn_beta_slow", 1.0)),
            "rope_attn_factor": attn_factor}


def experts_fields(meta: Meta, ffn: int) -> dict[str, Any]:
    """Mixture-of-experts fields (llama.cpp's expert_count / expert_used_count / expert_feed_forward_length)."""
    n = int(meta.get("expert_count", 0))
    if not n:
        return {}
    return {"num_experts": n, "num_experts_used": int(meta.require("expert_used_count")),
            "expert_intermediate_size": int(meta.get("expert_feed_forward_length", ffn))}


def standard_shapes(cfg: ModelConfig, names: set[str]) -> dict[str, tuple[int, ...]]:
    """The tensors the decoder reads, by llama.cpp's names, for this config."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, h)
    if "rope_freqs.weight" in names:
        shapes["rope_freqs.weight"] = ((cfg.rope_dim or d) // 2,)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        norms = {"pre": ("attn_norm", "ffn_norm"), "post": ("post_attention_norm", "post_ffw_norm"),
                 "sandwich": ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")}
        for norm in norms[cfg.norm_placement]:
            shapes[p + norm + ".weight"] = (h,)
        if cfg.qk_norm != "none":
            full = cfg.qk_norm == "full"
            shapes[p + "attn_q_norm.weight"] = (q if full else d,)
            shapes[p + "attn_k_norm.weight"] = (kv if full else d,)
        shapes.update({p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
                       p + "attn_output.weight": (h, q)})
        if cfg.attention_bias:
            shapes.update({p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)})
        if cfg.num_experts:
            e, ef = cfg.num_experts, cfg.expert_intermediate_size
            shapes.update({p + "ffn_gate_inp.weight": (e, h), p + "ffn_gate_exps.weight": (e, ef, h),
                           p + "ffn_up_exps.weight": (e, ef, h), p + "ffn_down_exps.weight": (e, h, ef)})
        else:
            shapes.update({p + "ffn_gate.weight": (f, h), p + "ffn_up.weight": (f, h),
                           p + "ffn_down.weight": (h, f)})
    return shapes
