"""The model stack's one builder: an engine's parts from one EngineConfig (hitenter/config.py).

`build_engine_parts` opens the model's GGUF once (its header parsed once, shared by the model's load and the
tokenizer) and builds the model, tokenizer, KV cache groups, kernel plan (hitenter/models/plan.py), runner,
scheduler and the speculative / vision extras. Runners past one process (tensor parallelism, disaggregated
prefill) come from hitenter/engine/runner_registry.py, where the package implementing them registers them:
this module never imports it."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from hitenter import envs
from hitenter.config import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from hitenter.engine.encoder_cache import EncoderCache
from hitenter.engine.model_runner import ModelRunner
from hitenter.engine.runner_registry import ParallelRunner, RunnerBuild, runners_for
from hitenter.engine.sampler import Sampler
from hitenter.engine.scheduler import Scheduler
from hitenter.engine.speculative import SpecDecoder, build_spec_decoder
from hitenter.kv_cache.manager import KVCacheManager
from hitenter.models.attention import kv_tensors
from hitenter.models.plan import KernelPlan, apply_plan, build_plan

log = logging.getLogger("hitenter.engine")

DEFAULT_MAX_MODEL_LEN = 8192
HEADER_ARRAY_MAX = 64   # EngineParts.header keeps arrays up to this long (not the vocabulary)
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineParts:
    model_path: str
    model_config: ModelConfig
    tokenizer: Any
    model: torch.nn.Module
    runner: ModelRunner
    kv_manager: KVCacheManager
    scheduler: Scheduler
    sampler: Sampler
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig      # max_model_len resolved
    max_model_len: int
    num_blocks: int
    spec: SpecDecoder | None = None      # speculative decoding, when asked for
    prefiller: Any = None                # prompts prefilled beside the engine's steps: the disaggregated
                                         # worker's PrefillClient, or the side prefill (engine/side_prefill.py)
    plan: KernelPlan | None = None       # which numeric path each row takes (decided at load)
    config: EngineConfig | None = None
    vision: EncoderCache | None = None   # the vision encoder behind its cache, when an mmproj is loaded
    header: dict[str, Any] = field(default_factory=dict)   # the file's key/values, arrays over HEADER_ARRAY_MAX left out


def total_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_kv_cache_memory(bytes_per_token: int, max_model_len: int, max_num_seqs: int) -> int:
    """A sensible share of RAM: enough for max_num_seqs full windows, capped at 10% of RAM,
    but never less than two full windows."""
    want = bytes_per_token * max_model_len * max_num_seqs
    floor = bytes_per_token * max_model_len * 2
    return max(min(want, total_ram_bytes() // 10), floor)


def torch_dtype(cfg: EngineConfig) -> torch.dtype:
    """The activation / KV dtype: "auto" runs fp32 activations over the GGUF's own blocks (models/formats.py)."""
    return torch.float32 if cfg.load.dtype == "auto" else TORCH_DTYPES[cfg.load.dtype]


def _check_combinations(cfg: EngineConfig) -> list[ParallelRunner]:
    """The parallel runners `cfg` asks for, after what can only be checked with the whole config
    (ValueError naming the option; nothing loaded)."""
    runners = runners_for(cfg)
    for runner in runners:
        runner.check(cfg)
    return runners


def _check_hybrid(cfg: EngineConfig) -> None:
    """ValueError (one line, naming the option) for what does not run on hybrid models yet."""
    if cfg.speculative.speculative_method == "draft_model":
        raise ValueError("speculative_method: a draft model does not run beside a hybrid (recurrent-state) "
                         "model yet; use ngram")
    if cfg.parallel.disaggregate is not None:
        raise ValueError("disaggregate: disaggregated prefill does not run on hybrid (recurrent-state) models yet")


def state_slots(cfg: EngineConfig, bytes_per_slot: int) -> int:
    """State slots of a hybrid model: one live slot per running sequence (and, speculating, per sequence the
    scratch slots of a verification, one per draft token, plus the slot the last verification's accepted run
    ended in, held until the next step has restored it: kv_cache/state_group.py) plus snapshots of the prefix
    cache: at least 4, at most 2 per sequence + 8, as many as fit a quarter of ``kv_cache_memory`` (the states
    are counted in it) or, by default, a twentieth of RAM."""
    live = cfg.scheduler.max_num_seqs
    if cfg.speculative.speculative_method is not None:
        live *= 2 + (cfg.speculative.num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS)
    if not cfg.cache.enable_prefix_caching:
        return live
    share = cfg.cache.kv_cache_memory // 4 if cfg.cache.kv_cache_memory else total_ram_bytes() // 20
    return live + max(4, min(2 * live + 8, share // max(bytes_per_slot, 1)))


def _load(cfg: EngineConfig,
          runners: list[ParallelRunner]) -> tuple[str, torch.nn.Module, ModelConfig, Any, dict[str, Any]]:
    """(path, model, its config, tokenizer, the header's short key/values): the file opened once, its header
    read once for all (a registered runner's `load`, if one of `runners` has one, loads the model instead of
    load_model); the tokenizer is shared with other engines on the same file (tokenizer/shared.py)."""
    from hitenter.models.gguf import GGUFStrings, open_gguf, read_gguf_metadata
    from hitenter.models.loader import load_model
    from hitenter.models.registry import resolve_model
    from hitenter.tokenizer.shared import shared_tokenizer

    model = cfg.load.model
    if model is not None and model.startswith("trigram"):
        # the playground's toy model: counts of (t-2, t-1) -> t over a bundled corpus, run by this same engine
        from hitenter.models.trigram import load_trigram

        net, mcfg, tokenizer = load_trigram(model)
        return model, net, mcfg, tokenizer, {}
    path = str(resolve_model(model))
    reader = open_gguf(path)
    loader = next((r.load for r in runners if r.load is not None), None)
    if loader is not None:   # e.g. tensor parallelism: this process is rank 0 and loads only its shard
        net, mcfg = loader(cfg, path, reader)
    else:
        net, mcfg = load_model(path, dtype=cfg.load.dtype, quantization=cfg.load.quantization,
                               batch_invariant=cfg.load.batch_invariant,
                               max_model_len=cfg.scheduler.max_model_len or DEFAULT_MAX_MODEL_LEN, reader=reader)
    meta = read_gguf_metadata(reader)
    header = {k: v for k, v in meta.items() if not (isinstance(v, list | GGUFStrings) and len(v) > HEADER_ARRAY_MAX)}
    return path, net, mcfg, shared_tokenizer(path, meta), header


def kv_cache_torch_dtype(cfg: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type for the option `kv_cache_dtype` (hitenter/models/kv_dtype.py)."""
    from hitenter.models.kv_dtype import resolve_kv_dtype

    return resolve_kv_dtype(cfg.cache.kv_cache_dtype, dtype, cfg.load.dtype)


def _num_blocks(cfg: EngineConfig, mcfg: ModelConfig, dtype: torch.dtype, max_model_len: int,
                state_bytes: int = 0) -> int:
    """Blocks in the budget; `dtype`: the KV cache's element type (its bytes per token). A hybrid model's
    state slots (`state_bytes`) are taken from a ``kv_cache_memory`` the user set, and added beside the
    default budget."""
    from hitenter.models.kv_dtype import check_head_dim, value_bytes

    check_head_dim(dtype, mcfg.head_dim)   # q8_0 refuses head dims not a power-of-two number of blocks, at load
    bs = cfg.cache.block_size
    per_token = max(mcfg.kv_bytes_per_token(value_bytes(dtype)), 1)   # a model without attention: a token
    per_block = per_token * bs
    budget = cfg.cache.kv_cache_memory or default_kv_cache_memory(per_token, max_model_len,
                                                                  cfg.scheduler.max_num_seqs)
    states = f" after {state_bytes} bytes of recurrent state slots" if cfg.cache.kv_cache_memory and state_bytes else ""
    num_blocks = max(budget - (state_bytes if cfg.cache.kv_cache_memory else 0), 0) // per_block
    need = -(-max_model_len // bs)
    if num_blocks < need:
        raise ValueError(
            f"kv_cache_memory: {budget} bytes hold {num_blocks} blocks of {bs} tokens{states} "
            f"({per_token} bytes per token), but one max_model_len={max_model_len} request needs "
            f"{need} blocks = {need * per_block} bytes; raise kv_cache_memory or lower max_model_len"
            + (" or max_num_seqs" if states else ""))
    return num_blocks


def _window_groups(cfg: EngineConfig, mcfg: ModelConfig, num_blocks: int,
                   sched: SchedulerConfig) -> tuple[int, int | None, int | None]:
    """(global blocks, local blocks, local window): a model with both global and sliding-window layers gives
    the local ones their own tables that release what the window left (hitenter/kv_cache/window_group.py),
    in the same memory; (num_blocks, None, None) otherwise, under tensor parallelism or disaggregated
    prefill (their workers keep one table), or with HITENTER_WINDOW_RELEASE=0."""
    from hitenter.kv_cache.window_group import split_blocks

    wins = [mcfg.layer_window(i) for i in range(mcfg.num_layers)]
    local = sum(w is not None for w in wins)
    if (not 0 < local < mcfg.num_layers or cfg.parallel.tensor_parallel_size > 1
            or cfg.parallel.disaggregate is not None or not envs.HITENTER_WINDOW_RELEASE.get()):
        return num_blocks, None, None
    window = max(w for w in wins if w is not None)
    # each group weighed by the bytes its layers' blocks take (Gemma 4: per-layer shapes, and KV-shared layers
    # that hold none): with equal layers this is the layer counts, scaled
    size = [mcfg.layer_kv_heads(i) * mcfg.layer_head_dim(i) if mcfg.layer_kv_source(i) == i else 0
            for i in range(mcfg.num_layers)]
    ng, nl = split_blocks(num_blocks, sum(s for s, w in zip(size, wins, strict=True) if w is None),
                          sum(s for s, w in zip(size, wins, strict=True) if w is not None), window,
                          cfg.cache.block_size, sched.max_num_seqs, sched.max_num_batched_tokens)
    return ng, nl, window


def _runner(cfg: EngineConfig, path: str, net: torch.nn.Module, mcfg: ModelConfig, dtype: torch.dtype,
            num_blocks: int, sched: SchedulerConfig, kv_dtype: torch.dtype | None = None,
            num_local_blocks: int | None = None, num_slots: int = 0,
            runners: tuple[ParallelRunner, ...] = ()) -> ModelRunner:
    """The one-process runner over the KV cache groups (a hybrid's state slots), handed in turn to each of
    `runners` (registered: hitenter/engine/runner_registry.py) to wrap."""
    from hitenter.models.attention import allocate_kv_caches

    bs, tp = cfg.cache.block_size, cfg.parallel.tensor_parallel_size
    kv_dtype = kv_dtype or dtype
    if not mcfg.causal:   # an encoder (models/encoder.py) keeps no KV: it runs only as pooling jobs
        return ModelRunner(net, [], bs)
    if num_slots:   # a hybrid model (models/hybrid.py): KV for its attention layers, states for the others
        return ModelRunner(net, net.allocate_caches(num_blocks, bs, kv_dtype, num_slots), bs)
    kv_caches = allocate_kv_caches(mcfg, num_blocks, bs, kv_dtype, num_local_blocks=num_local_blocks) if tp == 1 else []
    runner = ModelRunner(net, kv_caches, bs, staged=_side_prefill(cfg, net, kv_caches, sched, num_local_blocks))
    for parallel in runners:   # tensor parallelism (rank 0 of a group), a prefill worker beside this decoder
        runner = parallel.wrap(RunnerBuild(cfg, path, mcfg, runner, dtype, kv_dtype, num_blocks, sched))
    return runner


def _side_prefill(cfg: EngineConfig, net: torch.nn.Module, kv_caches: list[torch.Tensor], sched: SchedulerConfig,
                  num_local_blocks: int | None) -> Any:
    """Long prompts beside decoding streams on half of the cores (hitenter/engine/side_prefill.py), where
    it applies: one process, one block table for every layer, no draft model, more than one thread."""
    from hitenter.engine import side_prefill
    from hitenter.engine.side_prefill import SidePrefill
    from hitenter.models.decoder import CausalLM

    threads = torch.get_num_threads()
    if (sched.side_prefill_tokens == 0 or threads < 2 or not kv_caches or num_local_blocks is not None
            or not isinstance(net, CausalLM) or cfg.parallel.tensor_parallel_size > 1
            or cfg.parallel.disaggregate is not None or cfg.speculative.speculative_method is not None):
        return None
    chunk = min(side_prefill.CHUNK, sched.max_num_batched_tokens)
    return SidePrefill(net, kv_caches, cfg.cache.block_size, chunk, sched.side_prefill_tokens, threads)


_GC_FROZEN: list[str] = []   # "imports" once the first build began, "engine" once it ended


def _freeze_imports_once() -> None:
    """At the first engine's start: move what the process holds so far (its modules, classes and functions:
    hundreds of thousands of objects once torch is imported) out of the cyclic collector's sight after a
    collection of the young generations, so `_freeze_gc_once`'s full collection walks only what the load
    made. Garbage older than that is pinned, once per process."""
    if not _GC_FROZEN:
        gc.collect(1)
        gc.freeze()
        _GC_FROZEN.append("imports")


def _freeze_gc_once() -> None:
    """Move what exists after the first engine's start-up (model, tokenizer; the imports already are) out
    of the cyclic collector's sight, after a full collection of the rest: a collection then walks only what
    steps allocate, instead of everything. Once per process, so a process that builds many engines (the
    tests) pins at most the first one's objects."""
    if _GC_FROZEN == ["imports"]:
        gc.collect()
        gc.freeze()
        _GC_FROZEN.append("engine")


def build_engine_parts(cfg: EngineConfig) -> EngineParts:
    from hitenter.kernels.arena import keep_heap, trim_heap
    from hitenter.models import decode_kernel

    runners = _check_combinations(cfg)
    _freeze_imports_once()
    keep_heap()   # steps reuse their freed buffers instead of faulting fresh pages in (trimmed when idle)
    if cfg.load.num_threads:
        torch.set_num_threads(cfg.load.num_threads)
    dtype = torch_dtype(cfg)
    path, net, mcfg, tokenizer, header = _load(cfg, runners)
    max_model_len = cfg.scheduler.max_model_len or min(mcfg.context_length, DEFAULT_MAX_MODEL_LEN)
    if max_model_len > mcfg.context_length:
        raise ValueError(f"max_model_len: {max_model_len} exceeds the model's context length {mcfg.context_length}")
    sched_cfg = dataclasses.replace(cfg.scheduler, max_model_len=max_model_len)
    kv_dtype = kv_cache_torch_dtype(cfg, dtype)
    num_slots = per_slot = 0
    if mcfg.layer_types:   # recurrent layers: their state slots beside the KV blocks, in the same budget
        _check_hybrid(cfg)
        per_slot = net.state_bytes_per_slot()
        num_slots = state_slots(cfg, per_slot)
        log.info("recurrent state: %d slots of %.2f MB (%d running + snapshots), %.1f MB",
                 num_slots, per_slot / 1e6, sched_cfg.max_num_seqs, num_slots * per_slot / 1e6)
    num_blocks = _num_blocks(cfg, mcfg, kv_dtype, max_model_len, num_slots * per_slot)
    decode_kernel.load()   # build / load the fused attention kernel at start-up, not on the first request
    draft_blocks = num_blocks   # a draft model's cache keeps the one-table token count (it stops drafting when full)
    num_blocks, num_local, window = _window_groups(cfg, mcfg, num_blocks, sched_cfg)
    if mcfg.sliding_window:   # what the local layers' windows cost a full-length sequence, and what is done about it
        from hitenter.models.decoder import windowed_kv_bytes
        from hitenter.models.kv_dtype import value_bytes

        now, held = windowed_kv_bytes(mcfg, max_model_len, cfg.cache.block_size, value_bytes(kv_dtype))
        log.info("sliding window %d: a %d-token sequence would hold %.1f MB of KV with one table; %s %.1f MB "
                 "(%.0f%% less)%s", mcfg.sliding_window, max_model_len, now / 1e6,
                 "the local layers release their blocks outside the window:" if window else "releasing the "
                 "blocks outside the local layers' windows would leave", held / 1e6, 100 * (1 - held / now),
                 f"; {num_blocks} global and {num_local} local blocks" if window else "")
    runner = _runner(cfg, path, net, mcfg, dtype, num_blocks, sched_cfg, kv_dtype, num_local, num_slots,
                     tuple(runners))
    plan = build_plan(runner.model, kv_tensors(runner.kv_caches), dtype, cfg.load.batch_invariant)
    apply_plan(runner.model, plan)
    runner.plan = plan
    vision = _vision(cfg, path, mcfg, runner)
    log.info("kernel plan for %s:\n%s", path, plan.describe())
    kv_manager = KVCacheManager(num_blocks, cfg.cache.block_size, cfg.cache.enable_prefix_caching,
                                local_window=window, num_local_blocks=num_local, num_state_slots=num_slots)
    scheduler = Scheduler(sched_cfg, kv_manager)
    if vision is not None:
        scheduler.encoded = vision.__contains__
    spec = build_spec_decoder(cfg.speculative, tokenizer, mcfg.vocab_size, max_model_len, draft_blocks,
                              cfg.cache.block_size, dtype, cfg.load.dtype, cfg.load.quantization,
                              kv_dtype=kv_dtype, target=runner.model, target_path=path,
                              prefix_caching=cfg.cache.enable_prefix_caching)
    runner.keep_hidden = spec is not None and spec.wants_hidden
    trim_heap()   # the load's freed temporaries
    _freeze_gc_once()
    return EngineParts(path, mcfg, tokenizer, runner.model, runner, kv_manager, scheduler,
                       Sampler(), cfg.cache, sched_cfg, max_model_len, num_blocks, spec,
                       getattr(runner, "staged", None), plan, cfg, vision, header)


def _vision(cfg: EngineConfig, path: str, mcfg: ModelConfig, runner: ModelRunner) -> EncoderCache | None:
    """The vision encoder (in its EncoderCache, given to the runner) of the file named by ``mmproj``, or of the
    one beside the model that fits it (models/vision/discovery.py); None without one or with mmproj 'none'.
    A named file that does not fit the model, or a runner that cannot take image rows, is an error (a file
    found beside the model is then left out, with a warning)."""
    from pathlib import Path

    from hitenter.errors import ModelLoadError
    from hitenter.models.vision.discovery import check_mmproj_fits, find_mmproj, read_mmproj_config
    from hitenter.models.vision.loader import load_vision_encoder

    named = cfg.load.mmproj
    if named == "none" or not mcfg.causal or not Path(path).is_file():
        return None
    if named is not None:
        mm: Path | None = Path(named)
        if not mm.is_file():
            raise ValueError(f"mmproj: no such file {named}")
        check_mmproj_fits(read_mmproj_config(mm), mm, mcfg.architecture, mcfg.hidden_size)
    else:
        mm = find_mmproj(path, mcfg.architecture, mcfg.hidden_size)
        if mm is None:
            return None
    if type(runner) is not ModelRunner:
        why = "image input runs on the single-process runner only (no tensor parallelism or disaggregated prefill)"
        if named is None:   # found beside the model: serve text as before
            log.warning("vision encoder %s not loaded: %s", mm, why)
            return None
        raise ValueError(f"mmproj: {why}")
    try:
        cache = EncoderCache(load_vision_encoder(mm))
    except ModelLoadError as e:
        if named is not None:
            raise
        log.warning("vision encoder %s beside the model not loaded: %s", mm, e)   # text still serves
        return None
    runner.encoder_cache = cache
    log.info("vision encoder: %s (%s, %d tokens per image)", mm, cache.encoder.config.projector,
             cache.encoder.config.tokens_per_image)
    return cache
