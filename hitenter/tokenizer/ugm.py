"""SentencePiece unigram vocabularies (GGUF `tokenizer.ggml.model == "t5"`: XLM-R files such as bge-m3,
bge-reranker-v2-m3, multilingual-e5 and nomic-embed-text-v2-moe, and T5), with llama.cpp's ids.

The algorithm is llama.cpp's llm_tokenizer_ugm (llama-vocab.cpp), ported step for step:

- Normalization, per special-free text fragment, on UTF-8 bytes: at each position a user-defined token's
  text (longest) is kept as it is; else the longest prefix found in the file's
  `tokenizer.ggml.precompiled_charsmap` (SentencePiece's XOR-compressed double array of prefixes and their
  NUL-terminated replacements; nmt_nfkc for XLM-R) is replaced; else one valid UTF-8 character is kept, or
  one invalid byte becomes U+FFFD. Spaces (" " in the result) become "\u2581" (`escape_whitespaces`, always
  on for these files); with `tokenizer.ggml.remove_extra_whitespaces` runs of spaces collapse and every
  non-space run is preceded by one "\u2581" (leading and trailing spaces dropped); otherwise each space is
  kept and `tokenizer.ggml.add_space_prefix` puts one "\u2581" before the first non-space character.
- Viterbi over the normalized code points: every NORMAL, USER_DEFINED or UNUSED token (its text; a later
  duplicate wins) may cover a span, scoring its `tokenizer.ggml.scores` value (user-defined: 0); a code
  point no single token covers is the unknown token at score float32(min NORMAL score) - 10. Sums are
  doubles, a challenger replaces a position's best only when strictly greater, spans are tried by start
  then length; consecutive unknown tokens in the best path merge into one.
- Specials: BOS first and EOS last when adding specials (`tokenizer.ggml.add_bos_token`, default false;
  `add_eos_token`, default true); defaults EOS 1, UNK 2, PAD 0 when the keys are absent. `sep_token_id`
  (`seperator_token_id`) and `add_sep` (`add_sep_token`, default false) are read for the rerank pair
  format only (llama.cpp adds no SEP when tokenizing a unigram vocabulary).
  `encode(text, add_bos=None)` adds them as the file says (llama.cpp's add_special=true),
  `add_bos=False` adds neither, `add_bos=True` adds BOS and, when the file says so, EOS.
- Decoding as llama.cpp: NORMAL pieces with "\u2581" as spaces, the first piece's leading space dropped
  when `add_space_prefix` (default false), no clean_spaces; the rest is bpe.Tokenizer's `decode`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hitenter.errors import ModelLoadError
from hitenter.tokenizer.bpe import VOCAB_BUILDERS, Tokenizer
from hitenter.tokenizer.vocab_attrs import NORMAL, UNUSED, USER_DEFINED

SPACE = "\u2581"
_SPACE_BYTES = SPACE.encode()
_UNK_PENALTY = np.float32(10.0)
_DEFAULT_IDS = {"eos": 1, "unknown": 2, "padding": 0}
_REPLACEMENT = "\ufffd".encode()


def _utf8_len(lead: int) -> int:
    """llama.cpp's unicode_len_utf8: the sequence length a lead byte announces (1 for a stray byte)."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


def _valid_char(data: bytes, pos: int) -> int:
    """Length of the UTF-8 character at `pos` as llama.cpp's unicode_cpt_from_utf8 accepts it, or 0."""
    lead = data[pos]
    n = 1 if lead < 0x80 else 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else \
        4 if lead & 0xF8 == 0xF0 else 0
    if n == 0 or pos + n > len(data):
        return 0
    return n if all(data[pos + k] & 0xC0 == 0x80 for k in range(1, n)) else 0


class Charsmap:
    """SentencePiece's precompiled normalization map: the longest matching prefix and its replacement."""

    def __init__(self, blob: bytes) -> None:
        if not blob:
            self._xcda: Sequence[int] = ()
            self._repl = b""
            return
        if len(blob) < 4:
            raise ModelLoadError("tokenizer.ggml.precompiled_charsmap is too small for its header")
        (size,) = struct.unpack_from("<I", blob, 0)
        if size + 4 >= len(blob) or size % 4:
            raise ModelLoadError(f"tokenizer.ggml.precompiled_charsmap: XCDA size {size} does not fit "
                                 f"its {len(blob)} bytes")
        self._xcda = np.frombuffer(blob, dtype="<u4", count=size // 4, offset=4).tolist()
        self._repl = blob[4 + size:]

    def _node(self, i: int) -> int:
        if i >= len(self._xcda):
            raise ValueError("precompiled charsmap: index out of the XCDA array")
        return self._xcda[i]

    def match(self, data: bytes, pos: int) -> tuple[int, bytes] | None:
        """(bytes consumed, replacement) for the longest mapped prefix of data[pos:], or None."""
        if not self._xcda:
            return None
        node = self._node(0)
        index = (node >> 10) << ((node & (1 << 9)) >> 6)
        best: tuple[int, int] | None = None
        for p in range(pos, len(data)):
            c = data[p]
            if c == 0:
                break
            index ^= c
            node = self._node(index)
            if node & ((1 << 31) | 0xFF) != c:
                break
            leaf = (node >> 8) & 1
            index ^= (node >> 10) << ((node & (1 << 9)) >> 6)
            if leaf:
                best = (p - pos + 1, self._node(index) & ((1 << 31) - 1))
        if best is None:
            return None
        length, off = best
        end = self._repl.find(b"\0", off)
        if off >= len(self._repl) or end < 0:
            raise ValueError("precompiled charsmap: replacement out of bounds or unterminated")
        return length, self._repl[off:end]


def _charsmap_bytes(md: Mapping[str, Any]) -> bytes:
    raw = md.get("tokenizer.ggml.precompiled_charsmap")
    if raw is None:
        return b""
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw)
    return bytes(int(v) & 0xFF for v in raw)


class UgmTokenizer(Tokenizer):
    """A GGUF SentencePiece unigram vocabulary; bpe.Tokenizer's contracts with llama.cpp's UGM rules
    (module doc)."""

    sentencepiece_pieces = True

    def __init__(self, md: Mapping[str, Any]) -> None:
        tokens = md.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError("GGUF has no tokenizer.ggml.tokens")
        scores = md.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise ModelLoadError("a unigram ('t5') vocabulary needs tokenizer.ggml.scores, one per token")
        n = len(tokens)
        md = {**md, **{f"tokenizer.ggml.{k}_token_id": v for k, v in _DEFAULT_IDS.items()
                       if f"tokenizer.ggml.{k}_token_id" not in md}}
        super().__init__(md, None)  # type: ignore[arg-type]
        unk = md["tokenizer.ggml.unknown_token_id"]
        if not 0 <= int(unk) < n:
            raise ModelLoadError(f"tokenizer.ggml.unknown_token_id {unk} is outside the {n}-token vocabulary")
        self.unk_token_id = int(unk)
        self.add_eos = bool(md.get("tokenizer.ggml.add_eos_token", True)) and self.eos_token_id is not None
        sep = md.get("tokenizer.ggml.seperator_token_id")
        self.sep_token_id = int(sep) if sep is not None and 0 <= int(sep) < n else None
        self.add_sep = bool(md.get("tokenizer.ggml.add_sep_token", False)) and self.sep_token_id is not None
        self.add_space_prefix = bool(md.get("tokenizer.ggml.add_space_prefix", False))
        self.clean_spaces = False
        self._merge_spaces = bool(md.get("tokenizer.ggml.remove_extra_whitespaces", False))
        self._suffix = bool(md.get("tokenizer.ggml.treat_whitespace_as_suffix", False))
        self._charsmap = Charsmap(_charsmap_bytes(md))
        self._build_matchers([float(s) for s in scores])

    def _build_matchers(self, scores: list[float]) -> None:
        normal = [s for s, t in zip(scores, self._types, strict=True) if t == NORMAL]
        self._unk_score = float(np.float32(min(normal, default=np.finfo(np.float32).max)) - _UNK_PENALTY)
        self._pieces: dict[str, tuple[int, float]] = {}
        self._max_len: dict[str, int] = {}
        user: set[bytes] = set()
        for i, (text, kind) in enumerate(zip(self._tokens, self._types, strict=True)):
            if kind in (NORMAL, USER_DEFINED, UNUSED) and text:
                self._pieces[text] = (i, 0.0 if kind == USER_DEFINED else scores[i])
                self._max_len[text[0]] = max(self._max_len.get(text[0], 0), len(text))
            if kind == USER_DEFINED and text:
                user.add(text.encode("utf-8"))
        self._user = sorted(user, key=len, reverse=True)

    # ---- normalization -------------------------------------------------------------------------------
    def _normalize_prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        """(normalized bytes, input bytes consumed) at `pos`: llama.cpp's normalize_prefix."""
        for u in self._user:
            if data.startswith(u, pos):
                return u, len(u)
        hit = self._charsmap.match(data, pos)
        if hit is not None:
            return hit[1], hit[0]
        n = _valid_char(data, pos)
        return (data[pos:pos + n], n) if n else (_REPLACEMENT, 1)

    def normalize(self, text: str) -> str:
        """The normalized, space-escaped text the Viterbi pass sees (module doc)."""
        data = text.encode("utf-8", "surrogatepass")
        out = bytearray()
        prepend = not self._suffix and self.add_space_prefix
        prepended = in_word = False
        pos = 0
        while pos < len(data):
            piece, used = self._normalize_prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (prepend and not prepended) or self._merge_spaces:
                            out += _SPACE_BYTES
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self._merge_spaces:
                        out += _SPACE_BYTES
            pos += used
        if self._suffix and self.add_space_prefix:
            out += _SPACE_BYTES
        return out.decode("utf-8", "replace")

    # ---- Viterbi -------------------------------------------------------------------------------------
    def _viterbi(self, text: str) -> list[int]:
        """Best-scoring token ids of normalized `text` (llama.cpp's llm_tokenizer_ugm_session::tokenize)."""
        n = len(text)
        if n == 0:
            return []
        unk = self.unk_token_id
        best_score = [-1.7976931348623157e308] * (n + 1)
        best_id = [unk] * (n + 1)
        best_from = [0] * (n + 1)
        best_score[0] = 0.0
        pieces, max_len, unk_score = self._pieces, self._max_len, self._unk_score
        for i in range(n):
            base = best_score[i]
            single = False
            for j in range(i + 1, min(n, i + max_len.get(text[i], 0)) + 1):
                hit = pieces.get(text[i:j])
                if hit is None:
                    continue
                if j == i + 1:
                    single = True
                s = base + hit[1]
                if s > best_score[j]:
                    best_score[j], best_id[j], best_from[j] = s, hit[0], i
            if not single:
                s = base + unk_score
                if s > best_score[i + 1]:
                    best_score[i + 1], best_id[i + 1], best_from[i + 1] = s, unk, i
        out: list[int] = []
        pos, prev_unk = n, False
        while True:
            tid = best_id[pos]
            is_unk = tid == unk
            if not (prev_unk and is_unk):
                out.append(tid)
            if best_from[pos] == 0:
                break
            prev_unk, pos = is_unk, best_from[pos]
        out.reverse()
        return out

    def _encode_frags(self, parts: Sequence[str | int], add_bos: bool | None) -> list[int]:
        special = add_bos is None or add_bos
        with_bos = self.add_bos if add_bos is None else add_bos
        ids: list[int] = [self.bos_token_id] if with_bos and self.bos_token_id is not None else []
        frags: list[str | int] = []
        for f in parts:   # adjacent text fragments are one fragment, as in bpe.Tokenizer
            if isinstance(f, str) and frags and isinstance(frags[-1], str):
                frags[-1] += f
            else:
                frags.append(f)
        for f in frags:
            ids.extend(self._viterbi(self.normalize(f)) if isinstance(f, str) else (f,))
        if special and self.add_eos and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids


VOCAB_BUILDERS["t5"] = UgmTokenizer
