"""llama.cpp's own tokenizer test data (models/ggml-vocab-<name>.gguf with .gguf.inp / .gguf.out from the
llama.cpp source vendored in the llama-cpp-python sdist, hitenter.testing.llamacpp_vocab) for every
vocabulary of a family hitenter covers: ids with add_special=false, parse_special=false (and true),
decoding as llama_detokenize, vocab facts and token bytes, against llama.cpp goldens
(tests/goldens/llamacpp_vocab/, scripts/make_llamacpp_vocab_goldens.py) and the .gguf.out files. A
vocabulary shipped without .inp / .out (nomic-bert-moe, SentencePiece unigram) is checked on its golden's
texts only: the test-tokenizer-0 inputs, the tokenizer corpus and normalization strings."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from hitenter.testing.llamacpp_vocab import (
    VOCABS,
    WITHOUT_TEST_DATA,
    ensure_vocabs,
    input_texts,
    read_llamacpp_tests,
    vocab_path,
)
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tokenizer_checks import assert_llamacpp_entries, assert_token_bytes, assert_vocab_facts
from hitenter.tokenizer import Tokenizer

# the vocabularies (up to 256k tokens) take seconds each to build: the full suite, not the fast lane
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vocab_files() -> None:
    try:
        ensure_vocabs()
    except RuntimeError as e:
        pytest.skip(f"llama.cpp's test vocabularies are not available: {e}")


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request: pytest.FixtureRequest, vocab_files: None,
          gguf_tokenizer) -> tuple[str, Tokenizer, dict[str, Any]]:  # type: ignore[no-untyped-def]
    name = request.param
    golden = json.loads((GOLDENS / "llamacpp_vocab" / f"{name}.json").read_text())
    assert hashlib.sha256(vocab_path(name).read_bytes()).hexdigest() == golden["gguf_sha256"]
    return name, gguf_tokenizer(vocab_path(name)), golden


def test_every_listed_vocab_has_a_golden() -> None:
    assert sorted(p.stem for p in (GOLDENS / "llamacpp_vocab").glob("*.json")) == sorted(VOCABS)


def test_llamacpp_test_data(vocab: tuple[str, Tokenizer, dict[str, Any]]) -> None:
    """llama.cpp's test-tokenizer-0: the .gguf.out ids for each .gguf.inp text, add_special=false,
    parse_special=false."""
    name, tok, golden = vocab
    if name in WITHOUT_TEST_DATA:
        pytest.skip(f"llama.cpp {name} has no .gguf.out in this release (its golden is checked below)")
    tests = read_llamacpp_tests(name)
    assert [t for t, _ in tests] == [e["text"] for e in golden["entries"]]
    bad = [(t, ids) for t, ids in tests if tok.encode(t, add_bos=False, parse_special=False) != ids]
    assert not bad, f"{name}: {len(bad)}/{len(tests)} differ, e.g. {bad[0][0]!r}"


def test_ids_and_detokenize_match_llamacpp(vocab: tuple[str, Tokenizer, dict[str, Any]]) -> None:
    name, tok, golden = vocab
    texts = [e["text"] for e in golden["entries"]]
    assert texts[: len(input_texts(name))] == input_texts(name)
    assert_llamacpp_entries(tok, golden)


def test_vocab_facts_and_token_bytes(vocab: tuple[str, Tokenizer, dict[str, Any]]) -> None:
    assert_vocab_facts(*vocab[1:])
    assert_token_bytes(*vocab[1:])
