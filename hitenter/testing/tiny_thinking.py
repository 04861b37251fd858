"""A tiny vocabulary for a thinking model (tests only): tiny_model's vocabulary (ChatML specials, bytes,
merges) plus Qwen3's markers ``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>`` as single
user-defined tokens (type 4, as in Qwen3's GGUFs), and Qwen3.5's real chat template
(tests/data/templates/Qwen3.5-4B.jinja), which opens ``<think>`` at the end of the prompt when
thinking is on. Pass ``add_thinking_tokenizer`` as ``write_tiny_family(path, "qwen3", tokenizer=...)``.
"""

from __future__ import annotations

from pathlib import Path

import gguf

from hitenter.testing.tiny_model import tiny_vocab

USER_DEFINED = 4
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
TEMPLATE = Path(__file__).resolve().parents[2] / "tests" / "data" / "templates" / "Qwen3.5-4B.jinja"


def add_thinking_tokenizer(w: gguf.GGUFWriter) -> int:
    """Write the vocabulary and template (see the module docstring); the vocabulary size."""
    tokens, types, merges = tiny_vocab()
    tokens += list(MARKERS)
    types += [USER_DEFINED] * len(MARKERS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE.read_text())
    return len(tokens)
