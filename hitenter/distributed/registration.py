"""This package's runners, registered with the engine (hitenter/engine/runner_registry.py) when the package
is imported: tensor parallelism (``tensor_parallel_size`` > 1: rank 0 loads its shard beside the spawned
ranks, runner.py) and disaggregated prefill (``disaggregate``: a prefill worker process, disagg.py)."""

from __future__ import annotations

from typing import Any

import torch

from hitenter.config import EngineConfig, ModelConfig
from hitenter.distributed.disagg import check_options, launch_runner
from hitenter.distributed.runner import DistributedModelRunner, load_rank0
from hitenter.engine.engine_setup import DEFAULT_MAX_MODEL_LEN
from hitenter.engine.model_runner import ModelRunner
from hitenter.engine.runner_registry import ParallelRunner, RunnerBuild, register
from hitenter.models.decoder import CausalLM
from hitenter.models.loader import check_shardable


def _tp_load(cfg: EngineConfig, path: str, reader: Any) -> tuple[torch.nn.Module, ModelConfig]:
    """Rank 0's shard of the file at `path` (its open `reader`), the other ranks started loading theirs."""
    return load_rank0(path, cfg.load.dtype, cfg.parallel.tensor_parallel_size, cfg.load.num_threads,
                      cfg.load.quantization, cfg.load.batch_invariant,
                      cfg.scheduler.max_model_len or DEFAULT_MAX_MODEL_LEN, reader=reader)


def _tp_wrap(b: RunnerBuild) -> ModelRunner:
    """Rank 0's runner over the group (ValueError for a model that cannot be sharded)."""
    net = b.runner.model
    if not isinstance(net, CausalLM):
        raise ValueError("tensor_parallel_size: only GGUF transformer models can be sharded")
    check_shardable(b.model_config)
    return DistributedModelRunner.launch(net, b.dtype, b.num_blocks, b.cfg.cache.block_size,
                                         b.cfg.load.batch_invariant, kv_dtype=b.kv_dtype)


def _disagg_check(cfg: EngineConfig) -> None:
    opts = cfg.options()
    opts["quantization"] = opts["quantization"] or "none"
    check_options(cfg.parallel.disaggregate or "", cfg.load.model, opts)


def _disagg_wrap(b: RunnerBuild) -> ModelRunner:
    """This process decodes; a prefill worker process computes prompts' KV into its caches."""
    return launch_runner(b.cfg.parallel.disaggregate or "", b.path, b.dtype, b.model_config, b.runner.model,
                         b.runner.kv_caches, b.cfg.cache.block_size, b.scheduler.max_model_len,
                         b.scheduler.max_num_batched_tokens, b.cfg.load.num_threads)


register(ParallelRunner("tensor_parallel_size", _tp_wrap, load=_tp_load))
register(ParallelRunner("disaggregate", _disagg_wrap, check=_disagg_check))
