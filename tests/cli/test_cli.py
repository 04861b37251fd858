"""The command line, run as a user would (subprocesses of `python -m hitenter.cli`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hitenter.cli", *args], capture_output=True, text=True,
                          timeout=300, input=input)


def test_tokenize_json_equals_the_tokenizer(tiny_llama_path):
    from hitenter.tokenizer.bpe import Tokenizer

    r = _cli("tokenize", "Hello <|im_end|> world", "--model", str(tiny_llama_path), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["ids"] == Tokenizer.from_gguf(tiny_llama_path).encode("Hello <|im_end|> world")
    assert got["count"] == len(got["ids"]) and 2 in got["ids"]


@pytest.mark.slow
def test_run_streams_and_reports_speed(tiny_llama_path):
    r = _cli("run", "--raw", "hello", "--model", str(tiny_llama_path), "--max-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert "time to first token" in r.stderr and "tokens/s" in r.stderr
    assert "finish_reason=" in r.stderr


@pytest.mark.slow
def test_run_chat_template_default(tiny_llama_path):
    r = _cli("run", "hi", "--model", str(tiny_llama_path), "--max-tokens", "3", "--temperature", "0.7", "--seed", "3")
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_engine_flags_reach_the_engine(tiny_llama_path):
    r = _cli("run", "--raw", "hello", "--model", str(tiny_llama_path), "--max-tokens", "4", "--no-batch-invariant",
             "--block-size", "8", "--max-model-len", "64", "--speculative-method", "ngram")
    assert r.returncode == 0, r.stderr
    r = _cli("run", "--raw", "x" * 80, "--model", str(tiny_llama_path), "--max-model-len", "64", "--max-tokens", "4")
    assert r.returncode == 2 and "64" in r.stderr


@pytest.mark.slow
def test_bad_inputs_are_clear_errors(tiny_llama_path, tmp_path):
    r = _cli("pull", "no-such-model")
    assert r.returncode == 2 and "smollm2-135m-instruct" in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", "hi", "--model", str(tmp_path / "missing.gguf"))
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", "hi", "--model", str(tiny_llama_path), "--temperature", "5")
    assert r.returncode == 2 and "temperature" in r.stderr
    r = _cli("run", "hi", "--model", str(tiny_llama_path), "--max-tokens", "100000")
    assert r.returncode == 2 and "context window" in r.stderr


def test_models_lists_known_names():
    r = _cli("models")
    assert r.returncode == 0
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"):
        assert name in r.stdout


def test_serve_help_imports_no_torch():
    """`hitenter serve --help` reads its flags (the limits too) without torch, FastAPI or the engine."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "hitenter.cli", "serve", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--max-json-depth" in r.stdout, r.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "hitenter.server.body_limits" in imported                   # the trace saw the flags' module
    assert not imported & {"torch", "fastapi", "hitenter.engine", "hitenter.server.api_error"}, sorted(imported)


@pytest.mark.slow
def test_chat_repl(tiny_llama_path):
    r = _cli("chat", "--model", str(tiny_llama_path), "--max-tokens", "3", input="hello\nagain\n\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("finish_reason=") == 2
