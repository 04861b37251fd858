"""hitenter: what happens when you hit Enter, for real."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hitenter import omp_wait, onednn_isa

omp_wait.configure()   # before torch or a native kernel loads libgomp
onednn_isa.configure()   # before torch loads oneDNN

from hitenter.errors import ContextOverflowError, HitenterError, ModelLoadError, UnknownModelError  # noqa: E402
from hitenter.import_gc import collector_paused  # noqa: E402

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "ContextOverflowError",
           "HitenterError", "ModelLoadError", "UnknownModelError"]

if TYPE_CHECKING:
    from hitenter.llm import LLM
    from hitenter.outputs import CompletionOutput, RequestOutput
    from hitenter.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:   # lazy: `hitenter --help` and errors import without torch
    if name == "LLM":
        with collector_paused("hitenter.llm"):
            from hitenter.llm import LLM
        return LLM
    if name == "SamplingParams":
        from hitenter.sampling_params import SamplingParams
        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from hitenter import outputs
        return getattr(outputs, name)
    raise AttributeError(name)
