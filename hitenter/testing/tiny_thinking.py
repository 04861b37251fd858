"""A tiny vocabulary for a thinking model (tests only): tiny_model's vocabulary (ChatML specials, bytes,
merges) plus Qwen3's markers ``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>`` as single
user-defined tokens (type 4, as in Qwen3's GGUFs), and Qwen3.5's real chat template
(tests/data/templates/Qwen3.5-4B.jinja), which opens ``<think>`` at the end of the prompt when
thinking is on. Pass ``add_thinking_tokenizer`` as ``write_tiny_family(path, "qwen3", tokenizer=...)``.
"""

from __future__ import annotations

from pathlib import Path

import gguf

from hitenter.testing.tiny_model import add_tokenizer

MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
TEMPLATE = Path(__file__).resolve().parents[2] / "tests" / "data" / "templates" / "Qwen3.5-4B.jinja"


def add_thinking_tokenizer(w: gguf.GGUFWriter) -> int:
    """Write the vocabulary and template (see the module docstring); the vocabulary size."""
    return add_tokenizer(w, MARKERS, TEMPLATE.read_text())
