"""The entry points' step before they build an engine (hitenter.llm, hitenter.server, hitenter.cli).

`engine_config(model, config, options)` resolves an engine's options to its EngineConfig (LLMEngine's rules:
a config, or a model and flat options) and, when the config asks for runners past one process (tensor
parallelism, disaggregated prefill: hitenter/engine/runner_registry.py), imports hitenter.distributed's
registration so the engine's builder finds them. A one-process engine imports nothing of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hitenter.config import EngineConfig
from hitenter.engine.runner_registry import asked


def engine_config(model: str | None = None, config: EngineConfig | None = None,
                  options: Mapping[str, Any] | None = None) -> EngineConfig:
    """The EngineConfig of `config`, or of `model` and flat `options` (TypeError for both, or an unknown
    option); the runners it asks for registered."""
    if config is None:
        config = EngineConfig.from_options(model, **dict(options or {}))
    elif model is not None or options:
        raise TypeError("pass either config or model / options, not both")
    if asked(config):
        import hitenter.distributed.registration  # noqa: F401  (registers its runners at import)
    return config
