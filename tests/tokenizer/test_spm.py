"""Gemma 3's SentencePiece-BPE vocabulary (byte fallback) against llama.cpp goldens
(tests/goldens/tokenizer_gemma3.json, scripts/make_gemma_tokenizer_goldens.py): ids, vocab facts, token
bytes, round trips, and incremental detokenizing of byte-fallback pieces."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hitenter.paths import hitenter_home
from hitenter.sampling_params import SamplingParams
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tokenizer_checks import assert_token_bytes, assert_vocab_facts
from hitenter.tokenizer import Tokenizer
from hitenter.tokenizer.detokenizer import IncrementalDetokenizer
from hitenter.tokenizer.spm import SpmTokenizer, spm_merges

# the real Gemma 3 vocabulary (262k tokens) takes seconds to load: the full suite, not the fast lane
pytestmark = pytest.mark.slow
GOLDEN = GOLDENS / "tokenizer_gemma3.json"
GEMMA = hitenter_home() / "models" / "gemma-3-270m.gguf"


@pytest.fixture(scope="module")
def gemma_tok(gguf_tokenizer) -> tuple[Tokenizer, dict[str, Any]]:  # type: ignore[no-untyped-def]
    if not GEMMA.is_file():
        pytest.skip(f"{GEMMA} not present (hitenter pull gemma-3-270m)")
    if not GOLDEN.is_file():
        pytest.skip(f"{GOLDEN} missing (scripts/make_gemma_tokenizer_goldens.py)")
    return gguf_tokenizer(GEMMA), json.loads(GOLDEN.read_text())


def test_spm_merges_rank_by_the_merged_tokens_score() -> None:
    tokens = ["<unk>", "a", "b", "c", "ab", "bc", "abc", "<0x41>"]
    scores = [0.0, -1.0, -2.0, -3.0, -10.0, -5.0, -20.0, 0.0]
    types = [2, 1, 1, 1, 1, 1, 1, 6]
    # bc (-5) before ab (-10) before abc (-20); abc = a + bc = ab + c, splits in id order
    assert spm_merges(tokens, scores, types) == [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]


def test_small_spm_vocab_merges_and_falls_back_to_bytes() -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "i", "hi", "▁hi"]
    n = len(tokens)
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.scores": [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0],
          "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * 5, "tokenizer.ggml.bos_token_id": 1,
          "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_space_prefix": False}
    tok = Tokenizer.from_gguf(md)
    assert isinstance(tok, SpmTokenizer) and tok.vocab_size == n
    ids = tok.encode("hi hi é", add_bos=False)
    assert [tok.id_to_piece(i) for i in ids] == ["hi", "▁hi", "▁", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "hi hi é"
    assert Tokenizer.from_gguf({**md, "tokenizer.ggml.add_space_prefix": True}).encode("hi", add_bos=False) == [n - 1]


def test_golden_ids(gemma_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, golden = gemma_tok
    bad = [(e["text"], tok.encode(e["text"], add_bos=False), e["ids"]) for e in golden["tokenize"]
           if tok.encode(e["text"], add_bos=False) != e["ids"]]
    print(f"gemma tokenizer: {len(golden['tokenize']) - len(bad)}/{len(golden['tokenize'])} strings match llama.cpp")
    assert not bad, "\n".join(f"{t!r}: ours {a} llama.cpp {b}" for t, a, b in bad)


def test_vocab_facts_and_token_bytes(gemma_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    assert_vocab_facts(*gemma_tok)
    assert_token_bytes(*gemma_tok)


def test_round_trips_and_bos(gemma_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, golden = gemma_tok
    for e in golden["tokenize"]:
        # SentencePiece (and llama.cpp) turn a literal "▁" in the text into a space: the one lossy case
        assert tok.decode(tok.encode(e["text"], add_bos=False)) == e["text"].replace("\u2581", " ")
    assert tok.encode("hi")[0] == tok.bos_token_id == 2   # Gemma adds BOS by default


def test_incremental_detokenizer_with_byte_fallback(gemma_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, _ = gemma_tok
    text = "Hieroglyph 𓁹 and 𠜎, then 東京 👨‍👩‍👧"
    ids = tok.encode(text, add_bos=False)
    assert any(tok.id_to_piece(i).startswith("<0x") for i in ids)   # byte-fallback pieces really occur
    det = IncrementalDetokenizer(tok.token_bytes, tok.is_special, SamplingParams())
    chunks = [det.add(i).text for i in ids]
    assert "\ufffd" not in "".join(chunks)   # an incomplete UTF-8 sequence waits for its last byte
    assert "".join(chunks) + det.flush() == text
