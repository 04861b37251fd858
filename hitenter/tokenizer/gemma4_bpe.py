"""Gemma 4's vocabulary (GGUF `tokenizer.ggml.model == "gemma4"`): SentencePiece-style BPE with merges, as
llama.cpp's BPE tokenizer runs it with the "gemma4" pre-tokenizer (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GEMMA4).

On each special-free fragment: spaces become "▁" (U+2581, no prefix space), the text is split into runs of
non-newlines and runs of newlines (`[^\\n]+|[\\n]+`), and each run is BPE-merged over its raw UTF-8 characters
(no GPT-2 byte map) by the file's merge ranks (ties: leftmost), except that a run of newlines that is itself
a token is that token. A final symbol that is not a token becomes its bytes' `<0xXX>` tokens. The Rust
`tokenizers` BPE (byte fallback, no pre-tokenizer, one run at a time) does the merging.

llama.cpp also forces BOS on for this pre-tokenizer; pieces map back to bytes with "▁" as spaces, and
decoding is bpe.Tokenizer's (llama_detokenize with BPE's clean_spaces). The end-of-generation set (vocab_attrs)
holds "<eos>", "<turn|>" and "<|tool_response>" by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from hitenter.errors import ModelLoadError
from hitenter.tokenizer.bpe import VOCAB_BUILDERS
from hitenter.tokenizer.spm import SpmTokenizer

SPACE = "\u2581"
_RUNS = re.compile(r"[^\n]+|\n+")


@dataclass
class _Encoding:
    ids: list[int]


class _Gemma4Encoder:
    """`encode_batch(texts, add_special_tokens=False)` as the Rust tokenizer's, for Gemma 4's runs (module doc)."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str]) -> None:
        self.vocab = {t: i for i, t in enumerate(tokens)}   # later duplicates win, as llama.cpp's token_to_id
        pairs = []
        for m in merges:
            k = m.find(" ", 1)   # llama.cpp splits a merge at the first space after position 0
            if k > 0:
                pairs.append((m[:k], m[k + 1:]))
        try:
            bpe = models.BPE(vocab=self.vocab, merges=pairs, byte_fallback=True, fuse_unk=False)
        except Exception:   # merges whose parts are not tokens: keep the usable ones, as llama.cpp does
            pairs = [(a, b) for a, b in pairs if a in self.vocab and b in self.vocab and a + b in self.vocab]
            bpe = models.BPE(vocab=self.vocab, merges=pairs, byte_fallback=True, fuse_unk=False)
        self.hf = HFTokenizer(bpe)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[_Encoding]:
        out = []
        for text in texts:
            runs = _RUNS.findall(text.replace(" ", SPACE))
            whole = [self.vocab.get(r) if r[0] == "\n" else None for r in runs]
            rest = iter(self.hf.encode_batch([r for r, w in zip(runs, whole, strict=True) if w is None],
                                             add_special_tokens=False))
            ids: list[int] = []
            for w in whole:
                ids.extend(next(rest).ids if w is None else (w,))
            out.append(_Encoding(ids))
        return out


class Gemma4Tokenizer(SpmTokenizer):
    """A GGUF "gemma4" vocabulary (token bytes as SentencePiece pieces: SpmTokenizer); ids equal llama.cpp's."""

    def __init__(self, md: Mapping[str, Any], encoder: Any) -> None:
        super().__init__(md, encoder)
        self.add_bos = self.bos_token_id is not None   # llama.cpp overrides add_bos_token false for Gemma 4



def build_gemma4(md: Mapping[str, Any]) -> Gemma4Tokenizer:
    tokens, merges = md.get("tokenizer.ggml.tokens"), md.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise ModelLoadError("tokenizer model 'gemma4' needs tokenizer.ggml.tokens and tokenizer.ggml.merges")
    return Gemma4Tokenizer(md, _Gemma4Encoder(tokens, merges))


VOCAB_BUILDERS["gemma4"] = build_gemma4
