"""Runners past one process, registered by the package that implements them.

An option of ParallelConfig that puts a model over several processes (``tensor_parallel_size`` > 1,
``disaggregate``) is served by a `ParallelRunner` that hitenter/distributed registers here when it is
imported; the entry points (hitenter/engine_options.py) import it when an engine's options ask for one.
The engine's builder (hitenter/engine/engine_setup.py) finds them here and never imports that package: an
option asked for with nothing registered is a ValueError naming the option.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hitenter.config import EngineConfig, ModelConfig, SchedulerConfig
from hitenter.engine.model_runner import ModelRunner

# each option that needs a registered runner, and whether a config asks for it (in the order they apply)
ASKED: dict[str, Callable[[EngineConfig], bool]] = {
    "tensor_parallel_size": lambda cfg: cfg.parallel.tensor_parallel_size > 1,
    "disaggregate": lambda cfg: cfg.parallel.disaggregate is not None,
}


@dataclass(frozen=True)
class RunnerBuild:
    """What the builder has made when it hands a runner over: the model's file and config, the one-process
    runner (its model and KV caches), the activation and KV dtypes, the KV blocks and the scheduler's config."""
    cfg: EngineConfig
    path: str
    model_config: ModelConfig
    runner: ModelRunner
    dtype: torch.dtype
    kv_dtype: torch.dtype
    num_blocks: int
    scheduler: SchedulerConfig


def _no_check(cfg: EngineConfig) -> None:
    return None


@dataclass(frozen=True)
class ParallelRunner:
    """One option's runner. ``check``: ValueError naming an option for what the whole config cannot do,
    before anything loads. ``load``: the model instead of the one-process load (tensor parallelism: rank 0's
    shard, the other ranks started), given the config, the file's path and its open reader. ``wrap``: the
    runner the engine steps, built from the one-process one."""
    option: str
    wrap: Callable[[RunnerBuild], ModelRunner]
    check: Callable[[EngineConfig], None] = _no_check
    load: Callable[[EngineConfig, str, Any], tuple[torch.nn.Module, ModelConfig]] | None = None


_REGISTERED: dict[str, ParallelRunner] = {}


def register(runner: ParallelRunner) -> None:
    """Serve ``runner.option`` with `runner` (a later registration of the same option replaces it)."""
    if runner.option not in ASKED:
        raise ValueError(f"no engine option {runner.option!r} takes a parallel runner; known: {sorted(ASKED)}")
    _REGISTERED[runner.option] = runner


def asked(cfg: EngineConfig) -> list[str]:
    """The options of `cfg` that need a registered runner."""
    return [option for option, wants in ASKED.items() if wants(cfg)]


def runners_for(cfg: EngineConfig) -> list[ParallelRunner]:
    """The registered runners `cfg` asks for, in the order they apply; ValueError naming an option asked for
    with no runner registered."""
    missing = [option for option in asked(cfg) if option not in _REGISTERED]
    if missing:
        raise ValueError(f"{missing[0]}: no runner is registered for it in this process; import hitenter.distributed "
                         "first (hitenter.LLM, hitenter serve and the command line do when the option is set)")
    return [_REGISTERED[option] for option in asked(cfg)]
