"""Where the test suite's files are in a checkout: goldens, input data and the screenshots tests write, named
once so a test or a script finds them wherever it lives."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hitenter"
GOLDENS = REPO / "tests" / "goldens"        # reference outputs of independent implementations (scripts/make_*)
TEST_DATA = REPO / "tests" / "data"         # inputs (the tokenizer corpus)
TEST_OUTPUT = REPO / "test-output"          # screenshots the browser tests write (git-ignored)
