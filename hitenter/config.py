"""Frozen, validated configuration dataclasses.

ModelConfig comes from a GGUF file's metadata (see hitenter.models.gguf.model_config_from_metadata);
CacheConfig and SchedulerConfig are the engine's limits, spelled like vLLM's options.
"""

from __future__ import annotations

from dataclasses import dataclass


def _require(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{field}: {msg}")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str          # "llama" or "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    context_length: int        # the model's trained context window
    tie_word_embeddings: bool  # True when the GGUF has no output.weight
    attention_bias: bool = False  # qwen2: Q/K/V projections have biases
    name: str = ""
    # Gemma 3 (defaults: off, so llama / qwen2 configs are unchanged)
    sliding_window: int = 0           # keys a local layer sees (its own included); 0 = every layer is global
    sliding_window_pattern: int = 0   # layer i is global when (i + 1) % pattern == 0; 0 = all local if window
    rope_local_theta: float = 10000.0  # RoPE base of the local (sliding-window) layers
    rope_scaling_factor: float = 1.0  # linear RoPE scaling of the global layers (1 = none)
    query_pre_attn_scalar: float = 0.0  # attention scale = this ** -0.5; 0 = head_dim
    final_logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0 = none

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "context_length"):
            _require(getattr(self, f) > 0, f, f"must be > 0, got {getattr(self, f)}")
        _require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
                 f"{self.num_heads} heads are not a multiple of {self.num_kv_heads} KV heads")

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per element."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    kv_cache_memory: int | None = None   # bytes; None = a default share of RAM (see engine)
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _require(self.block_size > 0 and self.block_size <= 1024, "block_size",
                 f"must be in 1..1024, got {self.block_size}")
        if self.kv_cache_memory is not None:
            _require(self.kv_cache_memory > 0, "kv_cache_memory", f"must be > 0 bytes, got {self.kv_cache_memory}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    max_queued_requests: int | None = None   # None = unbounded waiting queue (the server sets a bound)

    def __post_init__(self) -> None:
        _require(self.max_num_seqs > 0, "max_num_seqs", f"must be > 0, got {self.max_num_seqs}")
        _require(self.max_num_batched_tokens > 0, "max_num_batched_tokens",
                 f"must be > 0, got {self.max_num_batched_tokens}")
        _require(self.max_model_len > 1, "max_model_len", f"must be > 1, got {self.max_model_len}")
        if self.max_queued_requests is not None:
            _require(self.max_queued_requests >= 0, "max_queued_requests",
                     f"must be >= 0, got {self.max_queued_requests}")
