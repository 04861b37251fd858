"""hitenter/server/serving_embedding.text_ids: an embedding input's tokens as llama.cpp's embedding mode
tokenizes it (llama_tokenize with add_special): a byte-level BPE file with add_eos_token gets its EOS after
the text (Qwen3-Embedding pools that token), one without it nothing more, and the unigram and WordPiece
vocabularies keep the end tokens they add themselves (never a second one)."""

from __future__ import annotations

from pathlib import Path

from hitenter.server.serving_embedding import text_ids
from hitenter.testing.tiny_encoders import write_tiny_encoder
from hitenter.tokenizer import Tokenizer, UgmTokenizer
from hitenter.tokenizer.gguf_meta import read_tokenizer_metadata
from hitenter.tokenizer.wordpiece import WordPieceTokenizer

TEXT = "what is the capital of france?"


def _md(tmp_path: Path, family: str) -> dict:
    return dict(read_tokenizer_metadata(write_tiny_encoder(tmp_path / f"{family}.gguf", family)))


def test_bpe_with_add_eos_ends_with_eos(tmp_path: Path) -> None:
    md = _md(tmp_path, "qwen3_embed")
    tok = Tokenizer.from_gguf({**md, "tokenizer.ggml.add_eos_token": True})
    plain = tok.encode(TEXT)
    assert plain[-1] != tok.eos_token_id
    assert text_ids(tok, TEXT) == plain + [tok.eos_token_id]


def test_bpe_without_add_eos_is_the_plain_encoding(tmp_path: Path) -> None:
    md = _md(tmp_path, "qwen3_embed")
    tok = Tokenizer.from_gguf({**md, "tokenizer.ggml.add_eos_token": False})
    assert text_ids(tok, TEXT) == tok.encode(TEXT)


def test_unigram_and_wordpiece_add_their_own_end_token_once(tmp_path: Path) -> None:
    ugm = Tokenizer.from_gguf(_md(tmp_path, "bert_rank_xlmr"))
    assert isinstance(ugm, UgmTokenizer) and ugm.add_eos
    ids = text_ids(ugm, TEXT)
    assert ids == ugm.encode(TEXT) and ids[-1] == ugm.eos_token_id and ids[-2] != ugm.eos_token_id
    wpm = Tokenizer.from_gguf(_md(tmp_path, "bert"))
    assert isinstance(wpm, WordPieceTokenizer)
    ids = text_ids(wpm, TEXT)
    assert ids == wpm.encode(TEXT) and ids[-1] == wpm.sep_token_id and ids[-2] != wpm.sep_token_id
