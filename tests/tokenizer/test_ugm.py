"""SentencePiece unigram ("t5") vocabularies, hitenter/tokenizer/ugm.py, on small handmade vocabularies: the
Viterbi pass against an exhaustive search over every segmentation, the space rules, the specials, and
clear load errors. (llama.cpp's ids on a real XLM-R vocabulary: test_llamacpp_vocabs.py, nomic-bert-moe.)"""

from __future__ import annotations

import itertools
import random
import struct
from typing import Any

import numpy as np
import pytest

from hitenter.errors import ModelLoadError
from hitenter.tokenizer import Tokenizer, UgmTokenizer

S = "\u2581"
SPECIALS = [("<pad>", 0.0, 3), ("</s>", 0.0, 3), ("<unk>", 0.0, 2)]
PIECES = [(S, -2.0), (S + "a", -1.5), ("a", -3.0), ("b", -3.0), ("ab", -4.5), ("abc", -6.9), ("c", -3.5),
          ("bc", -5.0), (S + "ab", -4.0), ("ca", -5.5), (S + "c", -4.2), ("\u00e9", -5.0)]


def _md(pieces: list[tuple[str, float]] = PIECES, **extra: Any) -> dict[str, Any]:
    toks = SPECIALS + [(t, s, 1) for t, s in pieces]
    return {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": [t for t, _, _ in toks],
            "tokenizer.ggml.scores": [s for _, s, _ in toks], "tokenizer.ggml.token_type": [k for _, _, k in toks],
            **extra}


def _best(text: str, pieces: dict[str, tuple[int, float]], unk: int, unk_score: float) -> list[int]:
    """Exhaustive search: the highest-scoring segmentation of `text` (each cut pattern tried; a piece not
    in the vocabulary must be one character, scored as unknown), consecutive unknowns merged."""
    best: tuple[float, list[int]] | None = None
    n = len(text)
    for cuts in itertools.product((False, True), repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        ids, score = [], 0.0
        for a, b in itertools.pairwise(bounds):
            hit = pieces.get(text[a:b])
            if hit is None and b - a > 1:
                break
            tid, s = hit if hit is not None else (unk, unk_score)
            ids.append(tid)
            score += s
        else:
            if best is None or score > best[0]:
                best = (score, ids)
    assert best is not None
    merged = [t for k, t in enumerate(best[1]) if not (k and t == unk and best[1][k - 1] == unk)]
    return merged


def test_viterbi_is_the_best_segmentation() -> None:
    tok = Tokenizer.from_gguf(_md())
    assert isinstance(tok, UgmTokenizer)
    pieces = {t: (i + len(SPECIALS), s) for i, (t, s) in enumerate(PIECES)}
    unk_score = float(np.float32(-6.9) - np.float32(10.0))
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice("abcx\u00e9") for _ in range(rng.randint(1, 11)))
        norm = tok.normalize(text)
        assert norm == text
        assert tok.encode(text, add_bos=False) == _best(norm, pieces, 2, unk_score), text


def test_space_rules() -> None:
    merge = Tokenizer.from_gguf(_md(**{"tokenizer.ggml.remove_extra_whitespaces": True}))
    assert merge.normalize("  ab   c ") == f"{S}ab{S}c"
    keep = Tokenizer.from_gguf(_md(**{"tokenizer.ggml.add_space_prefix": True}))
    assert keep.normalize(" ab  c ") == f"{S}{S}ab{S}{S}c{S}"
    plain = Tokenizer.from_gguf(_md())
    assert plain.normalize("ab c") == f"ab{S}c"
    assert plain.normalize("") == "" and plain.encode("", add_bos=False) == []


def test_specials_and_decode() -> None:
    tok = Tokenizer.from_gguf(_md(**{"tokenizer.ggml.add_space_prefix": True}))
    ab = tok.encode("ab", add_bos=False)
    assert tok.encode("ab") == ab + [1]                       # EOS by default, no BOS
    assert tok.encode("ab</s>ab", add_bos=False) == ab + [1] + ab
    assert tok.encode("ab</s>", add_bos=False, parse_special=False) != ab + [1]
    assert tok.decode(tok.encode("ab c")) == "ab c</s>"
    assert tok.decode(tok.encode("ab c"), skip_special_tokens=True) == "ab c"
    no_eos = Tokenizer.from_gguf(_md(**{"tokenizer.ggml.add_eos_token": False}))
    assert no_eos.encode("ab") == no_eos.encode("ab", add_bos=False)


def test_load_errors_are_clear() -> None:
    md = _md()
    with pytest.raises(ModelLoadError, match="scores"):
        Tokenizer.from_gguf({k: v for k, v in md.items() if k != "tokenizer.ggml.scores"})
    with pytest.raises(ModelLoadError, match="precompiled_charsmap"):
        Tokenizer.from_gguf({**md, "tokenizer.ggml.precompiled_charsmap": list(struct.pack("<I", 4096)) + [0] * 8})
    with pytest.raises(ModelLoadError, match="unknown_token_id"):
        Tokenizer.from_gguf({**md, "tokenizer.ggml.unknown_token_id": 999})
