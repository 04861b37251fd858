"""Assertions shared by the tokenizer tests: a Tokenizer against llama.cpp's golden facts for the same GGUF
(tests/goldens/*tokenizer*.json, written by scripts/make_*goldens.py)."""

from __future__ import annotations

import hashlib
from typing import Any

from hitenter.tokenizer import Tokenizer


def assert_vocab_facts(tok: Tokenizer, golden: dict[str, Any]) -> None:
    """Vocab size, BOS / EOS / add_bos, end-of-generation ids and special tokens as llama.cpp reports them."""
    assert tok.vocab_size == golden["n_vocab"]
    assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos) == (golden["bos"], golden["eos"], golden["add_bos"])
    assert tok.eog_token_ids == frozenset(golden["eog"])
    assert [i for i in range(tok.vocab_size) if tok.is_special(i)] == golden["special"]


def assert_token_bytes(tok: Tokenizer, golden: dict[str, Any]) -> None:
    """Every token's bytes: the first ones literally, all of them by a length-prefixed sha256."""
    assert [tok.token_bytes(i).hex() for i in range(len(golden["token_bytes_head"]))] == golden["token_bytes_head"]
    h = hashlib.sha256()
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        h.update(len(b).to_bytes(4, "little") + b)
    assert h.hexdigest() == golden["token_bytes_sha256"]
