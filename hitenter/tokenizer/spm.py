"""SentencePiece-style BPE vocabularies with byte fallback (GGUF `tokenizer.ggml.model == "llama"`), e.g. Gemma 3.

llama.cpp's SPM tokenizer (llm_tokenizer_spm) works on one special-free fragment at a time: spaces become
"▁" (U+2581; a leading one is added only when `tokenizer.ggml.add_space_prefix` is true), the text is
split into UTF-8 characters, and the adjacent pair whose concatenation is a vocabulary token with the
highest score is merged, repeatedly (ties: leftmost). A final symbol that is not a token falls back to
its UTF-8 bytes as `<0xXX>` tokens.

That is exactly a BPE whose merge list is every split (a, b) of every token t = a + b with a and b both
tokens, ranked by t's score (the construction HF's SentencePieceExtractor uses): the Rust `tokenizers`
BPE with `byte_fallback=True` then does the merging, and there is no pre-tokenizer (SPM merges across
word boundaries too). Only NORMAL tokens are merge results: control / user-defined tokens (Gemma's
"\\n\\n", "<start_of_turn>", html tags, ...) are split out of the text before BPE by `Tokenizer._partition`,
as llama.cpp's `tokenizer_st_partition` does, so they never reach the merges.

Pieces map back to bytes as llama.cpp's token_to_piece does: "▁" -> " " in NORMAL tokens, `<0xXX>` -> that byte.
`decode` is bpe.Tokenizer's (llama.cpp's llama_detokenize): with `add_space_prefix` the space the encoder
put before the text is dropped again from the first piece; SentencePiece has no `clean_spaces`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Regex, models, normalizers
from tokenizers import Tokenizer as HFTokenizer

from hitenter.errors import ModelLoadError
from hitenter.tokenizer.bpe import NORMAL, VOCAB_BUILDERS, Tokenizer

SPACE = "\u2581"


def spm_merges(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> list[tuple[str, str]]:
    """Every (a, b) with a, b and a + b tokens and a + b NORMAL, best-scoring result first.

    Per result, the splits are ordered by the ids of (a, b) (SentencePieceExtractor's order); the order
    among splits of one result never matters, since they produce the same token at the same rank."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)   # llama.cpp's text -> id keeps the first id for duplicate texts
    get = vocab.get
    ranked: list[tuple[float, int, int, int]] = []   # (-score, id of a + b, id of a, id of b): unique, no ties
    for i, t in enumerate(tokens):
        if len(t) < 2 or types[i] != NORMAL or vocab[t] != i:
            continue
        score = -float(scores[i])
        for k in range(1, len(t)):
            ia = get(t[:k])
            if ia is not None and (ib := get(t[k:])) is not None:
                ranked.append((score, i, ia, ib))
    ranked.sort()
    return [(tokens[ia], tokens[ib]) for _s, _i, ia, ib in ranked]


def build_spm(md: Mapping[str, Any]) -> HFTokenizer:
    """The Rust BPE (byte fallback, "▁" for spaces) equivalent to llama.cpp's SPM tokenizer for this vocab."""
    tokens, scores = md.get("tokenizer.ggml.tokens"), md.get("tokenizer.ggml.scores")
    types = md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens or ())
    if not tokens or scores is None or len(scores) != len(tokens):
        raise ModelLoadError("tokenizer model 'llama' without tokenizer.ggml.scores is not supported")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk = md.get("tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, types), byte_fallback=True, fuse_unk=False,
                     unk_token=tokens[int(unk)] if unk is not None and 0 <= int(unk) < len(tokens) else None)
    tok = HFTokenizer(bpe)
    steps: list[Any] = []
    if md.get("tokenizer.ggml.add_space_prefix", True):   # llama.cpp's default for SPM is True
        steps.append(normalizers.Prepend(SPACE))
    steps.append(normalizers.Replace(Regex(" "), SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    return tok


class SpmTokenizer(Tokenizer):
    """A GGUF SentencePiece-BPE vocabulary; the contracts are bpe.Tokenizer's, ids equal llama.cpp's."""

    sentencepiece_pieces = True

VOCAB_BUILDERS["llama"] = lambda md: SpmTokenizer(md, build_spm(md))
