"""Frozen, validated configuration dataclasses.

ModelConfig comes from a GGUF file's metadata (see hitenter.models.gguf.model_config_from_metadata).
EngineConfig is everything a user can set on an engine, in parts named like vLLM's (LoadConfig is
vLLM's ModelConfig: that name is taken here by the architecture), each option spelled like vLLM's:

    EngineConfig(load=LoadConfig(model=..., dtype=..., quantization=...), cache=CacheConfig(...),
                 scheduler=SchedulerConfig(...), speculative=SpeculativeConfig(...), parallel=ParallelConfig(...))

Every option is a field listed once, with its help text in the field's metadata: ``EngineConfig.
from_options(**flat)`` builds one from flat keyword arguments (``LLM(...)``, ``LLMEngine(...)``, the
server), and the CLI derives its flags from the same fields (``option_fields()``). A bad value raises
ValueError naming the field, a misspelled option TypeError listing the known ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = (None, "gguf", "int8", "int4")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "q8_0")
SPEC_METHODS = ("ngram", "draft_model", "mtp")
DEFAULT_NUM_SPECULATIVE_TOKENS = 4


def _require(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{field}: {msg}")


def _opt(default: Any, help: str, **meta: Any) -> Any:
    """A user option: its default and the help text the CLI shows (``flag``: a custom CLI spelling)."""
    return field(default=default, metadata={"help": help, **meta})


def _check_int(obj: Any, name: str, lo: int, hi: int | None = None, optional: bool = False) -> None:
    v = getattr(obj, name)
    if v is None and optional:
        return
    _require(isinstance(v, int) and not isinstance(v, bool), name, f"must be an integer, got {v!r}")
    _require(v >= lo and (hi is None or v <= hi), name,
             f"must be >= {lo}" + (f" and <= {hi}" if hi is not None else "") + f", got {v}")


def _check_bool(obj: Any, name: str) -> None:
    _require(isinstance(getattr(obj, name), bool), name, f"must be true or false, got {getattr(obj, name)!r}")


def _check_choice(obj: Any, name: str, choices: tuple[Any, ...]) -> None:
    _require(getattr(obj, name) in choices, name, f"must be one of {list(choices)}, got {getattr(obj, name)!r}")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str          # general.architecture: a family of hitenter/models/families
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
    # What a family does differently from Llama (hitenter/models/families): the defaults are Llama's.
    sliding_window: int = 0           # keys a local layer sees (its own included); 0 = every layer is global
    sliding_window_pattern: int = 0   # layer i is global when (i + 1) % pattern == 0; 0 = all local if window
    swa_layers: tuple[bool, ...] = () # per layer, True = local (the file's pattern array); overrides the above
    rope_local_theta: float = 0.0     # the local layers' own RoPE base, unscaled (no linear / YaRN); 0 = global's
    rope_scaling_factor: float = 1.0  # linear RoPE scaling: positions / factor (Gemma 3: global layers only)
    rope_dim: int = 0                 # dimensions rotated (partial rotary: the first rope_dim); 0 = head_dim
    rope_attn_factor: float = 1.0     # cos/sin multiplied by this (LongRoPE / YaRN's attention factor)
    rope_original_context: int = 0    # LongRoPE: contexts up to this use the short factors, longer the long
    rope_yarn_factor: float = 0.0     # YaRN scaling (llama.cpp's ggml rope with ext_factor 1); 0 = none
    rope_yarn_original_context: int = 0
    rope_yarn_beta_fast: float = 32.0
    rope_yarn_beta_slow: float = 1.0
    no_rope_interval: int = 0         # layer i has no RoPE when (i + 1) % interval == 0 (SmolLM3); 0 = none
    rope_sections: tuple[int, ...] = ()   # M-RoPE (Qwen-VL): rotated pairs per position axis (t, h, w, e), () = one axis
    rope_interleaved: bool = False    # M-RoPE sections interleaved pair by pair (llama.cpp IMROPE: qwen3vl)
    deepstack_layers: int = 0         # Qwen3-VL: image rows carry this many extra blocks, one added after each first layer
    # query temperature (Ministral 3, Llama 4): q x (1 + scale ln(floor((pos + offset) / floor) + 1)) after RoPE
    attn_temperature_scale: float = 0.0   # 0 = none
    attn_temperature_floor: int = 0
    attn_temperature_offset: float = 0.0
    attn_temperature_nope_only: bool = False  # only on the layers without RoPE (Llama 4)
    # Llama 4: chunked local attention on the RoPE layers (a query sees the keys of its own chunk of this many
    # positions, up to itself; 0 = none), q and k RMS-normed without a weight after RoPE on those layers, and
    # experts on every moe_layer_step-th layer (layer i when (i + 1) % step == 0; 0 = every layer)
    attention_chunk: int = 0
    qk_l2_norm: bool = False
    moe_layer_step: int = 0
    expert_weights_on_input: bool = False  # each routed expert's input times its weight, not its output (Llama 4)
    # Per-layer attention shapes and shared KV (Gemma 4, models/gemma4.py): the local layers' head size and
    # rotated dims (0 = head_dim / rope_dim), each layer's KV heads (() = num_kv_heads everywhere), FFN widths
    # (() = intermediate_size), the last kv_shared_layers layers reading the KV of the last earlier layer of
    # their kind (local / global) instead of keeping their own, and the per-layer input width (0 = none)
    head_dim_swa: int = 0
    rope_dim_swa: int = 0
    kv_heads_per_layer: tuple[int, ...] = ()
    ffn_per_layer: tuple[int, ...] = ()
    kv_shared_layers: int = 0
    per_layer_input_size: int = 0
    query_pre_attn_scalar: float = 0.0  # attention scale = this ** -0.5; 0 = head_dim
    attention_scale: float = 0.0      # the attention scale itself where a family sets it (Granite); 0 = above
    attn_logit_softcap: float = 0.0   # scores = cap * tanh(scores / cap) before the softmax; 0 = none
    final_logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0 = none
    logit_scale: float = 1.0          # logits multiplied by this (Granite: 1 / its logit_scale)
    embedding_scale: float = 1.0      # token embeddings multiplied by this (Gemma: sqrt(hidden); Granite)
    residual_scale: float = 1.0       # each block's output multiplied by this before its residual add
    norm_placement: str = "pre"       # "pre": x + f(norm(x)); "sandwich": x + norm(f(norm(x))); "post": x + norm(f(x));
                                      # "post_residual": norm(x + f(x)) (BERT)
    qk_norm: str = "none"             # "head": RMSNorm of each Q/K head (Qwen3, Gemma); "full": of the whole Q/K
    activation: str = "silu"          # the gated FFN's activation: "silu" (SwiGLU), "gelu_tanh" (GeGLU) or
                                      # "swiglu_oai" (gpt-oss: clamped, x sigmoid(1.702 x) (u + 1)), or
                                      # "relu2" (an ungated FFN: relu(up(x))^2, Nemotron-H)
    num_experts: int = 0              # mixture of experts: experts per layer (0 = a dense FFN)
    num_experts_used: int = 0         # experts each token is routed to
    expert_intermediate_size: int = 0  # one expert's FFN width
    expert_norm_topk: bool = True     # the top-k routing weights renormalised to sum to 1
    expert_gating: str = "softmax"    # "softmax" over all experts, "softmax_weight" (over the chosen k) or
                                      # "sigmoid" (each expert's own; LFM2-MoE, Nemotron-H MoE)
    # Hybrid models (hitenter/models/hybrid.py): each layer's token mixer, "attention" or a recurrent kind
    # (hitenter/models/recurrent: "gated_deltanet", "short_conv", "mamba2") or "ffn" (an FFN-only layer);
    # () = every layer is attention.
    # A recurrent layer keeps a fixed-size state per sequence (kv_cache/state_group.py), not KV blocks.
    layer_types: tuple[str, ...] = ()
    attn_output_gate: bool = False    # attention output x sigmoid(gate), the gate from a doubled Q projection
    ssm_conv_kernel: int = 0          # llama.cpp's ssm.conv_kernel (or shortconv.l_cache): causal conv taps
    ssm_state_size: int = 0           # ssm.state_size: a head's key dim (Gated DeltaNet) / state dim (Mamba2)
    ssm_group_count: int = 0          # ssm.group_count: key heads (Gated DeltaNet) / B, C groups (Mamba2)
    ssm_time_step_rank: int = 0       # ssm.time_step_rank: value heads (Gated DeltaNet) / heads (Mamba2)
    ssm_inner_size: int = 0           # ssm.inner_size: value heads x head value dim
    ssm_grouped_heads: bool = False   # Gated DeltaNet, key heads < value heads: value head h reads key head
                                      # h // (value / key heads) (Qwen3-Next), else h % key heads (Qwen3.5)
    use_rope: bool = True             # False: no layer rotates Q/K (Nemotron-H; Granite 4's hybrids)
    expert_weights_scale: float = 0.0  # the routed experts' weights times this (0 or 1: unscaled)
    leading_dense_layers: int = 0     # an MoE model's first layers with a dense FFN (leading_dense_block_count)
    # Embedding and reranking models (hitenter/models/encoder.py, models/pooling.py)
    causal: bool = True               # False: bidirectional attention, no KV cache ({arch}.attention.causal)
    pooling: str = ""                 # {arch}.pooling_type: "none", "mean", "cls", "last", "rank"; "" = unstated
    norm_type: str = "rms"            # "rms" (RMSNorm) or "layer" (LayerNorm with a bias: BERT)

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "context_length"):
            _require(getattr(self, f) > 0, f, f"must be > 0, got {getattr(self, f)}")
        _require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
                 f"{self.num_heads} heads are not a multiple of {self.num_kv_heads} KV heads")
        _check_choice(self, "norm_placement", ("pre", "sandwich", "post", "post_residual"))
        _check_choice(self, "pooling", ("", "none", "mean", "cls", "last", "rank"))
        _check_choice(self, "norm_type", ("rms", "layer"))
        _check_choice(self, "qk_norm", ("none", "head", "full"))
        _check_choice(self, "activation", ("silu", "gelu_tanh", "swiglu_oai", "relu2"))
        _check_choice(self, "expert_gating", ("softmax", "softmax_weight", "sigmoid"))
        _require(0 <= self.rope_dim <= self.head_dim and self.rope_dim % 2 == 0, "rope_dim",
                 f"must be even and <= head_dim {self.head_dim}, got {self.rope_dim}")
        _require(not self.num_experts or 0 < self.num_experts_used <= self.num_experts, "num_experts_used",
                 f"must be in 1..{self.num_experts}, got {self.num_experts_used}")
        _require(not self.layer_types or len(self.layer_types) == self.num_layers, "layer_types",
                 f"must name all {self.num_layers} layers, got {len(self.layer_types)}")
        _require(not self.swa_layers or len(self.swa_layers) == self.num_layers, "swa_layers",
                 f"must name all {self.num_layers} layers, got {len(self.swa_layers)}")
        _require(not self.attn_temperature_scale or self.attn_temperature_floor > 0, "attn_temperature_floor",
                 f"must be > 0 with a query temperature, got {self.attn_temperature_floor}")
        for name in ("kv_heads_per_layer", "ffn_per_layer"):
            _require(not getattr(self, name) or len(getattr(self, name)) == self.num_layers, name,
                     f"must name all {self.num_layers} layers, got {len(getattr(self, name))}")
        _require(0 <= self.kv_shared_layers < self.num_layers, "kv_shared_layers",
                 f"must be in 0..{self.num_layers - 1}, got {self.kv_shared_layers}")

    @property
    def attn_scale(self) -> float:
        """The factor on Q.K: the family's own, else query_pre_attn_scalar ** -0.5, else head_dim ** -0.5."""
        return self.attention_scale or (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_window(self, i: int) -> int | None:
        """Layer i's sliding window (a local layer) or None (a global layer); llama.cpp's swa pattern."""
        if self.sliding_window <= 0:
            return None
        if self.swa_layers:
            return self.sliding_window if self.swa_layers[i] else None
        p = self.sliding_window_pattern
        return None if p > 0 and (i + 1) % p == 0 else self.sliding_window

    def layer_has_rope(self, i: int) -> bool:
        """False for the layers a family runs without RoPE (SmolLM3: every no_rope_interval-th; all of them
        where use_rope is False)."""
        return self.use_rope and not (self.no_rope_interval and (i + 1) % self.no_rope_interval == 0)

    def layer_head_dim(self, i: int) -> int:
        """Layer i's head size (a local layer's may differ: head_dim_swa)."""
        return self.head_dim_swa if self.head_dim_swa and self.layer_window(i) is not None else self.head_dim

    def layer_kv_heads(self, i: int) -> int:
        """Layer i's KV heads."""
        return self.kv_heads_per_layer[i] if self.kv_heads_per_layer else self.num_kv_heads

    def layer_kv_source(self, i: int) -> int:
        """The layer whose KV cache layer i reads: i itself, or for the last kv_shared_layers layers the one
        llama.cpp's gemma4 layer reuse names: a local layer the second-last layer before them, a global one
        the last (families/gemma4.py checks that those are of the same kinds)."""
        first_shared = self.num_layers - self.kv_shared_layers
        if not self.kv_shared_layers or i < first_shared:
            return i
        return first_shared - (2 if self.layer_window(i) is not None else 1)

    def layer_chunk(self, i: int) -> int | None:
        """Layer i's attention chunk (Llama 4's RoPE layers) or None."""
        return self.attention_chunk if self.attention_chunk > 0 and self.layer_has_rope(i) else None

    def layer_has_experts(self, i: int) -> bool:
        """Whether layer i's FFN is the mixture of experts (every layer of an MoE model, or every
        moe_layer_step-th)."""
        return self.num_experts > 0 and (self.moe_layer_step <= 0 or (i + 1) % self.moe_layer_step == 0)

    def layer_q_temperature(self, i: int) -> bool:
        """Whether layer i scales its queries by the position's temperature (attn_temperature_*)."""
        return self.attn_temperature_scale != 0.0 and not (self.attn_temperature_nope_only and self.layer_has_rope(i))

    def is_recurrent(self, i: int) -> bool:
        """True when layer i keeps a recurrent state instead of a KV cache (a hybrid model's)."""
        return bool(self.layer_types) and self.layer_types[i] not in ("attention", "ffn")

    @property
    def num_attention_layers(self) -> int:
        """Layers that keep a KV cache (every layer unless layer_types says otherwise)."""
        if not self.layer_types:
            return self.num_layers
        return sum(t == "attention" for t in self.layer_types)

    def kv_bytes_per_token(self, dtype_bytes: float = 4) -> int:
        """2 (K and V) x attention layers x KV heads x head dim x bytes per element (q8_0: 34 / 32,
        models/kv_dtype.py)."""
        if self.head_dim_swa or self.kv_heads_per_layer or self.kv_shared_layers:   # per-layer shapes
            return int(2 * dtype_bytes * sum(self.layer_kv_heads(i) * self.layer_head_dim(i)
                                             for i in range(self.num_layers) if self.layer_kv_source(i) == i))
        return int(2 * self.num_attention_layers * self.num_kv_heads * self.head_dim * dtype_bytes)


@dataclass(frozen=True)
class LoadConfig:
    """Which model and how its weights are held (vLLM's ModelConfig options)."""

    model: str | None = _opt(None, "known name, path to a .gguf, or hf:owner/repo/file.gguf", flag="--model")
    dtype: str = _opt("auto", "weights: auto = the GGUF's own quantized blocks with fp32 activations "
                            "(hitenter/models/formats.py); float32 = every weight dequantized (the HF-exact "
                            "reference); bfloat16 = dequantized to bf16", choices=DTYPES)
    quantization: str | None = _opt(None, "weights kept in memory as gguf blocks, int8 or int4 (hitenter/quant)",
                                    choices=QUANTIZATIONS[1:])
    num_threads: int | None = _opt(None, "torch threads (default: torch's choice)")
    mmproj: str | None = _opt(None, "vision projector (llama.cpp mmproj GGUF) for image input; default: an "
                                    "mmproj*.gguf beside the model that fits it; 'none': no vision encoder",
                              flag="--mmproj")
    batch_invariant: bool = _opt(True, "pad rows so results are bitwise batch invariant", flag="--no-batch-invariant")

    def __post_init__(self) -> None:
        _require(self.model is None or isinstance(self.model, str), "model", f"must be a string, got {self.model!r}")
        _require(self.mmproj is None or isinstance(self.mmproj, str), "mmproj", f"must be a path, got {self.mmproj!r}")
        # old spellings still accepted: torch dtypes, fp32 / bf16 / fp16, quantization "none"
        dtype = str(self.dtype).removeprefix("torch.")
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(dtype, dtype))
        if self.quantization == "none":
            object.__setattr__(self, "quantization", None)
        _check_choice(self, "dtype", DTYPES)
        _check_choice(self, "quantization", QUANTIZATIONS)
        _check_int(self, "num_threads", 1, optional=True)
        _check_bool(self, "batch_invariant")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = _opt(16, "tokens per KV block")
    kv_cache_memory: int | None = _opt(None, "bytes of KV cache (default: a share of RAM)")
    enable_prefix_caching: bool = _opt(True, "reuse the KV of shared prompt prefixes",
                                       flag="--no-enable-prefix-caching")
    kv_cache_dtype: str = _opt("auto", "KV cache elements: auto = half precision (float16 on CPUs with F16C, "
                                       "else bfloat16; bf16 for bfloat16 weights, float32 for the float32 "
                                       "reference load); float32 doubles the bytes per token; q8_0 as "
                                       "llama.cpp's --cache-type-k/v q8_0 (34 bytes per 32 values, head_dim a "
                                       "multiple of 32) (hitenter/models/kv_dtype.py)",
                               choices=KV_CACHE_DTYPES)

    def __post_init__(self) -> None:
        kvd = str(self.kv_cache_dtype).removeprefix("torch.")
        object.__setattr__(self, "kv_cache_dtype", DTYPE_ALIASES.get(kvd, kvd))
        _check_choice(self, "kv_cache_dtype", KV_CACHE_DTYPES)
        _check_int(self, "block_size", 1, 1024)
        _check_int(self, "kv_cache_memory", 1, optional=True)
        _check_bool(self, "enable_prefix_caching")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = _opt(64, "most requests running at once")
    max_num_batched_tokens: int = _opt(2048, "token budget of one engine step")
    max_model_len: int | None = _opt(None, "context window to serve (default: the model's, capped at 8192)")
    max_queued_requests: int | None = _opt(None, "most requests waiting (default: unbounded)", cli=False)
    fresh_tokens: int = _opt(4, "a new request's first N tokens run in steps of their own, ahead of the "
                                "running batch (hitenter/engine/fresh_lane.py); 0: off")
    side_prefill_tokens: int = _opt(1024, "a prompt of at least N uncached tokens arriving while streams "
                                          "decode is prefilled on half of the cores beside them "
                                          "(hitenter/engine/side_prefill.py); 0: off")

    def __post_init__(self) -> None:
        _check_int(self, "fresh_tokens", 0)
        _check_int(self, "side_prefill_tokens", 0)
        _check_int(self, "max_num_seqs", 1)
        _check_int(self, "max_num_batched_tokens", 1)
        _check_int(self, "max_model_len", 2, optional=True)
        _check_int(self, "max_queued_requests", 0, optional=True)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (hitenter/engine/speculative). ``speculative_model`` "ngram" / "[ngram]" selects
    prompt lookup; a model alone selects "draft_model"; method "mtp" drafts with the target file's own MTP
    block; ``method`` is None when speculation is off."""

    speculative_model: str | None = _opt(None, "draft model sharing the target's tokenizer")
    speculative_method: str | None = _opt(None, "'ngram' (prompt lookup, no draft model), 'draft_model', or "
                                                "'mtp' (the model file's own MTP block; Qwen3.5 / 3.6)",
                                          choices=SPEC_METHODS)
    num_speculative_tokens: int | None = _opt(None, "tokens drafted per step when speculating (default 4)")

    def __post_init__(self) -> None:
        model, method, k = self.speculative_model, self.speculative_method, self.num_speculative_tokens
        if model in ("ngram", "[ngram]"):
            model, method = None, method or "ngram"
        if method is None and model:
            method = "draft_model"
        if method is None:
            _require(k is None, "num_speculative_tokens", "needs speculative_model or speculative_method")
        else:
            _require(method in SPEC_METHODS, "speculative_method", f"must be one of {list(SPEC_METHODS)}, got {method!r}")
            _require(method not in ("ngram", "mtp") or not model, "speculative_model",
                     f"not used with speculative_method={method!r}")
            _require(method != "draft_model" or bool(model), "speculative_model",
                     "required for speculative_method='draft_model'")
            k = DEFAULT_NUM_SPECULATIVE_TOKENS if k is None else k
        object.__setattr__(self, "speculative_model", model)
        object.__setattr__(self, "speculative_method", method)
        object.__setattr__(self, "num_speculative_tokens", k)
        _check_int(self, "num_speculative_tokens", 1, optional=True)

    @property
    def enabled(self) -> bool:
        return self.speculative_method is not None


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = _opt(1, "processes to shard every layer across (torch.distributed)")
    disaggregate: str | None = _opt(None, "'prefill=1,decode=1': prompts prefilled in a separate worker process")

    def __post_init__(self) -> None:
        _check_int(self, "tensor_parallel_size", 1)
        _require(self.disaggregate is None or isinstance(self.disaggregate, str), "disaggregate",
                 f"must be a string like 'prefill=1,decode=1', got {self.disaggregate!r}")


SECTIONS = {"load": LoadConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
            "speculative": SpeculativeConfig, "parallel": ParallelConfig}


def option_fields() -> list[tuple[str, dataclasses.Field[Any]]]:
    """(section, field) of every engine option, in declaration order (the CLI's flags come from these)."""
    return [(s, f) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


@dataclass(frozen=True)
class EngineConfig:
    load: LoadConfig = field(default_factory=LoadConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        tp, quant = self.parallel.tensor_parallel_size, self.load.quantization
        _require(quant in (None, "none", "gguf") or tp == 1, "quantization",
                 "int8 / int4 weights with tensor_parallel_size > 1 are not supported yet")

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> EngineConfig:
        """From flat keyword options (vLLM's names). None means "the default" for every option."""
        parts: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        where = {f.name: s for s, f in option_fields()}
        unknown = sorted(set(options) - set(where))
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(where)}")
        if model is not None:
            options["model"] = model
        for name, value in options.items():
            if value is not None:
                parts[where[name]][name] = value
        return cls(**{s: SECTIONS[s](**kw) for s, kw in parts.items()})

    def options(self) -> dict[str, Any]:
        """The flat options (every field, defaults included)."""
        return {f.name: getattr(getattr(self, s), f.name) for s, f in option_fields()}

    def replace(self, **options: Any) -> EngineConfig:
        """A copy with some flat options changed (validated again)."""
        return EngineConfig.from_options(**{**self.options(), **options})
