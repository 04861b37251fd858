"""``hitenter serve``'s lifecycle flags: a bad value is one error line and status 2, before any model loads."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args,words", [
    (["--keep-alive", "5min"], "--keep-alive: invalid duration '5min'"),
    (["--keep-alive", "soon"], "--keep-alive: invalid duration"),
    (["--max-loaded-models", "0"], "max_loaded_models: at least 1"),
    (["--max-loaded-memory", "-5"], "max_loaded_memory: a positive number of bytes"),
])
def test_bad_values_are_one_line(args: list[str], words: str) -> None:
    r = subprocess.run([sys.executable, "-m", "hitenter.cli", "serve", "--model", "/nonexistent.gguf", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("hitenter: error: ") and words in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
