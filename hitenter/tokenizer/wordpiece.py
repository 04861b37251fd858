"""WordPiece tokenizer of a GGUF "bert" vocabulary (BGE, all-MiniLM, nomic-embed-text), with llama.cpp's ids.

convert_hf_to_gguf stores BERT's vocabulary in "phantom space" form: a word-initial piece `w` as "\u2581w",
a continuation piece `##w` as the bare "w", CONTROL tokens ([CLS], [SEP], ...) as they are. This module
turns it back into HF WordPiece form and lets the Rust `tokenizers` library tokenize: BertNormalizer
(control characters dropped, CJK characters split, lower-casing and accent stripping as
`tokenizer.ggml.normalizer.lowercase` / `strip_accents` say, both on by default as in llama.cpp),
BertPreTokenizer (whitespace and punctuation split), WordPiece (longest match first, `[UNK]` for a word
without a match, no word-length limit, as llama.cpp's WPM has none).

Specials as llama.cpp (llama-vocab.cpp, tokenizer model "bert"): BOS (= [CLS]) 101, UNK 100, SEP 102,
PAD 0, MASK 103 unless the file's keys say otherwise; `encode(text)` adds BOS first and SEP last
(llama.cpp's add_bos / add_sep; no EOS); `decode` joins pieces with the phantom space as a space, then
cleans the spaces before punctuation as llama.cpp's clean_spaces. A `sep_token_id` attribute gives SEP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from hitenter.errors import ModelLoadError
from hitenter.tokenizer.bpe import VOCAB_BUILDERS, Tokenizer
from hitenter.tokenizer.vocab_attrs import CONTROL, NORMAL, UNKNOWN, USER_DEFINED

PHANTOM = "\u2581"
DEFAULT_IDS = {"bos": 101, "unknown": 100, "seperator": 102, "padding": 0, "mask": 103}


def _special_id(md: Mapping[str, Any], key: str, n: int) -> int | None:
    v = md.get(f"tokenizer.ggml.{key}_token_id", DEFAULT_IDS.get(key))
    return int(v) if v is not None and 0 <= int(v) < n else None


def build_wordpiece(md: Mapping[str, Any]) -> HFTokenizer:
    """The Rust WordPiece tokenizer equivalent to llama.cpp's WPM for this vocabulary."""
    tokens = md.get("tokenizer.ggml.tokens")
    types = md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens or ())
    if not tokens:
        raise ModelLoadError("GGUF has no tokenizer.ggml.tokens")
    vocab: dict[str, int] = {}
    for i, (t, kind) in enumerate(zip(tokens, types, strict=False)):
        piece = t if kind in (CONTROL, UNKNOWN, USER_DEFINED) else (t[1:] if t.startswith(PHANTOM) else "##" + t)
        vocab.setdefault(piece, i)
    unk = _special_id(md, "unknown", len(tokens))
    if unk is None:
        raise ModelLoadError("a WordPiece vocabulary needs an unknown token (tokenizer.ggml.unknown_token_id)")
    tok = HFTokenizer(models.WordPiece(vocab=vocab, unk_token=tokens[unk], max_input_chars_per_word=1 << 30))
    lower = bool(md.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(md.get("tokenizer.ggml.normalizer.strip_accents", lower))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip,
                                                lowercase=lower)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


class WordPieceTokenizer(Tokenizer):
    """A GGUF WordPiece vocabulary; bpe.Tokenizer's contracts with llama.cpp's WPM specials (module doc)."""

    def __init__(self, md: Mapping[str, Any], hf: HFTokenizer) -> None:
        n = len(md["tokenizer.ggml.tokens"])
        md = {**md, "tokenizer.ggml.bos_token_id": _special_id(md, "bos", n)}
        super().__init__(md, hf)
        self.add_bos = self.bos_token_id is not None
        self.sep_token_id = _special_id(md, "seperator", n)
        self.add_sep = bool(md.get("tokenizer.ggml.add_sep_token", True)) and self.sep_token_id is not None
        self.clean_spaces = True

    def _encode_frags(self, parts: Sequence[str | int], add_bos: bool | None) -> list[int]:
        ids = super()._encode_frags(parts, add_bos)
        special = self.add_bos if add_bos is None else add_bos
        return ids + [self.sep_token_id] if special and self.add_sep and self.sep_token_id is not None else ids

    def token_bytes(self, token_id: int) -> bytes:
        """A NORMAL piece with its phantom space as a space; the rest as bpe.Tokenizer."""
        b = self._token_bytes.get(token_id)
        if b is None:
            if self._types[token_id] == NORMAL:
                b = self._tokens[token_id].replace(PHANTOM, " ").encode("utf-8")
                self._token_bytes[token_id] = b
            else:
                b = super().token_bytes(token_id)
        return b


VOCAB_BUILDERS["bert"] = lambda md: WordPieceTokenizer(md, build_wordpiece(md))
