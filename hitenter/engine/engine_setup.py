"""Builds an engine's parts from a model reference and the engine's limits (vLLM's option names)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from hitenter.config import CacheConfig, ModelConfig, SchedulerConfig
from hitenter.engine.model_runner import ModelRunner
from hitenter.engine.sampler import Sampler
from hitenter.engine.scheduler import Scheduler
from hitenter.engine.spec import SpecDecoder, build_spec_decoder
from hitenter.kv_cache.manager import KVCacheManager

log = logging.getLogger("hitenter.engine")
DEFAULT_MAX_MODEL_LEN = 8192
# Bitwise batch invariance (see models/llama.py). Its cost is measured by bench/batch_invariance.py.
DEFAULT_BATCH_INVARIANT = True
ENGINE_OPTIONS = ("kv_cache_memory", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                  "enable_prefix_caching", "max_queued_requests", "dtype", "num_threads",
                  "speculative_model", "speculative_method", "num_speculative_tokens",
                  "tensor_parallel_size", "batch_invariant", "disaggregate", "quantization")


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
    scheduler_config: SchedulerConfig
    max_model_len: int
    num_blocks: int
    spec: SpecDecoder | None = None      # speculative decoding, when asked for
    disagg: Any = None                   # disaggregated prefill's PrefillClient, when asked for


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


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "auto": torch.float32,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype: must be one of {sorted(table)}, got {name!r}")
    return table[name]


def build_engine_parts(model: str | None = None, **kwargs: Any) -> EngineParts:
    unknown = set(kwargs) - set(ENGINE_OPTIONS)
    if unknown:
        raise TypeError(f"unknown engine option(s) {sorted(unknown)}; known: {list(ENGINE_OPTIONS)}")
    from hitenter.models.loader import load_model
    from hitenter.models.registry import resolve_model
    from hitenter.tokenizer.bpe import Tokenizer

    if kwargs.get("num_threads"):
        torch.set_num_threads(int(kwargs["num_threads"]))
    tp_size = int(kwargs.get("tensor_parallel_size") or 1)
    if kwargs.get("disaggregate"):   # checked before anything loads (hitenter/distributed/disagg.py)
        from hitenter.distributed.disagg import check_options, launch_runner

        check_options(str(kwargs["disaggregate"]), model, kwargs)
    if tp_size > 1:   # tensor parallel: this process is rank 0 and loads only its shard (hitenter/distributed)
        from hitenter.distributed.runner import load_rank0
    dtype = _dtype(kwargs.get("dtype") or "float32")
    quant = kwargs.get("quantization") or "none"   # weights kept int8 / int4 in memory (hitenter/quant)
    if quant != "none" and tp_size > 1:
        raise ValueError("quantization: quantized weights with tensor_parallel_size > 1 are not supported yet")
    if model is not None and model.startswith("trigram"):
        # the playground's toy model: counts of (t-2, t-1) -> t over a bundled corpus, run by this same engine
        from hitenter.models.trigram import load_trigram

        net, mcfg, tokenizer = load_trigram(model)
        path = model
    else:
        path = str(resolve_model(model))
        net, mcfg = (load_model(path, dtype=dtype, quantization=quant) if tp_size == 1
                     else load_rank0(path, dtype, tp_size, kwargs.get("num_threads")))
        tokenizer = Tokenizer.from_gguf(path)

    max_model_len = kwargs.get("max_model_len") or min(mcfg.context_length, DEFAULT_MAX_MODEL_LEN)
    if max_model_len > mcfg.context_length:
        raise ValueError(f"max_model_len: {max_model_len} exceeds the model's context length {mcfg.context_length}")
    sched_cfg = SchedulerConfig(
        max_num_seqs=kwargs.get("max_num_seqs") or 64,
        max_num_batched_tokens=kwargs.get("max_num_batched_tokens") or 2048,
        max_model_len=max_model_len,
        max_queued_requests=kwargs.get("max_queued_requests"),
    )
    prefix = kwargs.get("enable_prefix_caching")
    cache_cfg = CacheConfig(block_size=kwargs.get("block_size") or 16,
                            kv_cache_memory=kwargs.get("kv_cache_memory"),
                            enable_prefix_caching=True if prefix is None else bool(prefix))
    dtype_bytes = torch.empty(0, dtype=dtype).element_size()
    per_token = mcfg.kv_bytes_per_token(dtype_bytes)
    per_block = per_token * cache_cfg.block_size
    budget = cache_cfg.kv_cache_memory or default_kv_cache_memory(per_token, max_model_len, sched_cfg.max_num_seqs)
    num_blocks = budget // per_block
    need_blocks = -(-max_model_len // cache_cfg.block_size)
    if num_blocks < need_blocks:
        raise ValueError(
            f"kv_cache_memory: {budget} bytes hold {num_blocks} blocks of {cache_cfg.block_size} tokens "
            f"({per_token} bytes per token), but one max_model_len={max_model_len} request needs "
            f"{need_blocks} blocks = {need_blocks * per_block} bytes; raise kv_cache_memory or lower max_model_len")
    from hitenter.models import decode_kernel
    from hitenter.models.attention import allocate_kv_caches

    decode_kernel.load()   # build / load the fused attention kernel at start-up, not on the first request
    if hasattr(net, "batch_invariant"):
        bi = kwargs.get("batch_invariant")
        net.batch_invariant = DEFAULT_BATCH_INVARIANT if bi is None else bool(bi)

    if mcfg.sliding_window:   # sliding-window layers keep their old blocks (masked): say what that costs
        from hitenter.models.gemma3 import windowed_kv_bytes

        now, held = windowed_kv_bytes(mcfg, max_model_len, cache_cfg.block_size, dtype_bytes)
        log.info("sliding window %d: a %d-token sequence holds %.1f MB of KV; freeing the blocks outside the "
                 "local layers' windows would leave %.1f MB (%.0f%% less)", mcfg.sliding_window, max_model_len,
                 now / 1e6, held / 1e6, 100 * (1 - held / now))
    kv_caches = allocate_kv_caches(mcfg, num_blocks, cache_cfg.block_size, dtype) if tp_size == 1 else []
    kv_manager = KVCacheManager(num_blocks, cache_cfg.block_size, cache_cfg.enable_prefix_caching)
    scheduler = Scheduler(sched_cfg, kv_manager)
    runner = ModelRunner(net, kv_caches, cache_cfg.block_size)
    if tp_size > 1:   # this process becomes rank 0 of a tensor-parallel group and spawns the others
        from hitenter.distributed.runner import DistributedModelRunner
        from hitenter.models.llama import LlamaModel

        if not isinstance(net, LlamaModel):
            raise ValueError("tensor_parallel_size: only llama / qwen2 GGUF models can be sharded")
        runner = DistributedModelRunner.launch(net, dtype, num_blocks, cache_cfg.block_size, net.batch_invariant)
        net, kv_caches = runner.model, runner.kv_caches
    if kwargs.get("disaggregate"):   # a prefill worker process computes prompts' KV; this process decodes
        runner = launch_runner(str(kwargs["disaggregate"]), path, dtype, mcfg, net, kv_caches, cache_cfg.block_size,
                               max_model_len, sched_cfg.max_num_batched_tokens, kwargs.get("num_threads"))
    spec = build_spec_decoder(kwargs, tokenizer, mcfg.vocab_size, max_model_len, num_blocks, cache_cfg.block_size,
                              dtype)
    return EngineParts(path, mcfg, tokenizer, net, runner, kv_manager, scheduler, Sampler(),
                       cache_cfg, sched_cfg, max_model_len, num_blocks, spec, getattr(runner, "disagg", None))
