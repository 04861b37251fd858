"""Engines the server tests serve, one per module: the tiny random Llama, and the tiny random Qwen2 whose chat
template reads `tools` (so tool requests are accepted; the grammar makes the tiny model call)."""

from __future__ import annotations

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
