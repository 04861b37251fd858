"""Tokenizer tests against llama.cpp goldens (tests/goldens/tokenizer_*.json, written by
scripts/make_tokenizer_goldens.py): ids for every corpus string, vocab facts, token bytes, round trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hitenter.errors import ModelLoadError
from hitenter.paths import hitenter_home
from hitenter.testing.paths import GOLDENS, TEST_DATA
from hitenter.testing.tokenizer_checks import assert_token_bytes, assert_vocab_facts
from hitenter.tokenizer import Tokenizer, read_tokenizer_metadata

CORPUS: list[str] = json.loads((TEST_DATA / "tokenizer_corpus.json").read_text())
MODELS = {"smollm2": "smollm2-135m-instruct", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct"}


@pytest.fixture(scope="module", params=sorted(MODELS))
def golden_tok(request: pytest.FixtureRequest, gguf_tokenizer) -> tuple[Tokenizer, dict[str, Any]]:  # type: ignore[no-untyped-def]
    short = request.param
    golden = json.loads((GOLDENS / f"tokenizer_{short}.json").read_text())
    if short == "smollm2":
        path = request.getfixturevalue("smollm2_path")
    else:
        path = hitenter_home() / "models" / f"{MODELS[short]}.gguf"
        if not path.is_file():
            pytest.skip(f"{path} not present (hitenter pull {MODELS[short]})")
    return gguf_tokenizer(path), golden


def test_corpus_is_diverse() -> None:
    assert len(CORPUS) >= 60
    joined = "".join(CORPUS)
    for needle in ("123456789012", "٣", "Ⅻ", "²", "👨‍👩‍👧‍👦", "🇺🇸", "中", "한", "ह", "م", "\x00", "\x1b",
                   "<|im_start|>", "'re", "\t", "\n\n\n", "https://"):
        assert needle in joined, needle


def test_golden_ids(golden_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, golden = golden_tok
    assert [e["text"] for e in golden["tokenize"]] == CORPUS, "corpus changed: regenerate the goldens"
    bad = [(e["text"], tok.encode(e["text"]), e["ids"]) for e in golden["tokenize"] if tok.encode(e["text"]) != e["ids"]]
    assert not bad, "\n".join(f"{t!r}: ours {a} llama.cpp {b}" for t, a, b in bad)


def test_vocab_facts(golden_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    assert_vocab_facts(*golden_tok)


def test_token_bytes_match_llama(golden_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    assert_token_bytes(*golden_tok)


def test_round_trips(golden_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, _ = golden_tok
    for s in CORPUS:
        ids = tok.encode(s)
        assert tok.decode(ids) == s
        assert b"".join(tok.token_bytes(i) for i in ids) == s.encode("utf-8")


def test_specials_and_decode_options(golden_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, _ = golden_tok
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    start, end = ids[0], ids[-1]
    assert tok.is_special(start) and tok.is_special(end) and end in tok.eog_token_ids
    assert tok.id_to_piece(start) == "<|im_start|>" and tok.token_bytes(end) == b"<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert tok.encode("") == [] and tok.decode([]) == ""
    assert tok.encode("hi", add_bos=True)[0] == tok.bos_token_id
    assert tok.id_to_piece(tok.encode(" the")[0]) == "Ġthe"
    lone = next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xc3")
    assert tok.decode([lone]) == "\ufffd"
    with pytest.raises(TypeError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_chat_goldens(golden_tok: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, golden = golden_tok
    for c in golden["chat"]:
        text = tok.apply_chat_template(c["messages"], add_generation_prompt=c["add_generation_prompt"])
        assert text == c["text"]
        ids = tok.apply_chat_template(c["messages"], add_generation_prompt=c["add_generation_prompt"], tokenize=True)
        assert ids == c["ids"]


@pytest.mark.slow
def test_fast_reader_matches_gguf_package(smollm2_path: Path) -> None:
    from hitenter.models.gguf import read_gguf_metadata

    ours, ref = read_tokenizer_metadata(smollm2_path), read_gguf_metadata(smollm2_path)
    assert ours.keys() == ref.keys()
    for k, v in ref.items():
        assert ours[k] == pytest.approx(v) if isinstance(v, float) else ours[k] == v, k


def test_odd_merges_are_skipped_not_fatal(smollm2_path: Path) -> None:
    md = read_tokenizer_metadata(smollm2_path)
    odd = {**md, "tokenizer.ggml.merges": ["zz qq", *md["tokenizer.ggml.merges"]]}
    tok, ref = Tokenizer.from_gguf(odd), Tokenizer.from_gguf(md)
    assert tok.encode(CORPUS[2]) == ref.encode(CORPUS[2])


def test_tiny_model_tokenizer(tiny_llama_path: Path) -> None:
    tok = Tokenizer.from_gguf(tiny_llama_path)
    assert tok.vocab_size > 259 and tok.eos_token_id in tok.eog_token_ids and not tok.add_bos
    for s in CORPUS:
        assert tok.decode(tok.encode(s)) == s
    assert tok.encode("<|im_start|>Hello world<|im_end|>")[0] == 1
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


def test_bad_inputs(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Tokenizer.from_gguf(junk)
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        cut.write_bytes(f.read(300_000))  # truncated inside the token list
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        Tokenizer.from_gguf(cut)
    md = read_tokenizer_metadata(smollm2_path)
    with pytest.raises(ModelLoadError, match="not supported"):
        Tokenizer.from_gguf({**md, "tokenizer.ggml.model": "llama"})
    with pytest.raises(ModelLoadError, match="unsupported pre-tokenizer"):
        Tokenizer.from_gguf({**md, "tokenizer.ggml.pre": "made-up"})
