"""Engines the server tests serve: one per module of the tiny random Llama and of the tiny random Qwen2 whose
chat template reads `tools` (so tool requests are accepted; the grammar makes the tiny model call), and one
per session of the real Qwen2.5-Coder-0.5B for the real-client modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hitenter.engine.llm_engine import LLMEngine

TOOLS_TEMPLATE = "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}"


@pytest.fixture(scope="module")
def engine(tiny_llama_path: Path) -> LLMEngine:
    """The tiny random Llama with the engine's defaults."""
    return LLMEngine(str(tiny_llama_path))


@pytest.fixture(scope="module")
def tools_engine(tiny_qwen2_path: Path) -> LLMEngine:
    """The tiny random Qwen2 with a chat template that uses `tools`."""
    eng = LLMEngine(str(tiny_qwen2_path))
    eng.tokenizer.chat_template += TOOLS_TEMPLATE
    return eng


@pytest.fixture(scope="session")
def qwen_coder_engine() -> Iterator[object]:
    """Qwen2.5-Coder-0.5B in one LLMEngine (2048-token window) for the real-client modules: each serves it
    behind its own app, whose AsyncLLMEngine shuts down with the app while the engine outlives it."""
    from hitenter.models.registry import resolve_model

    yield LLMEngine(str(resolve_model("qwen2.5-coder-0.5b-instruct")), max_model_len=2048)


@pytest.fixture(scope="module")
def vision_engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    """The tiny random Gemma 3 with its tiny mmproj beside it (found by the engine: images accepted)."""
    from hitenter.testing.tiny_vision import write_tiny_gemma3_with_mmproj

    text, _ = write_tiny_gemma3_with_mmproj(tmp_path_factory.mktemp("vision"))
    return LLMEngine(str(text))
