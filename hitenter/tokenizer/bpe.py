"""Byte-level BPE tokenizer built from a GGUF vocabulary, matching llama.cpp's token ids exactly.

Contracts:
- `Tokenizer.from_gguf(path_or_metadata)` accepts a GGUF path or a metadata dict (as from
  `read_gguf_metadata` / `read_tokenizer_metadata`). Only `tokenizer.ggml.model == "gpt2"` (byte-level BPE)
  is supported here (SentencePiece: spm.py); the pre-tokenizer is chosen by `tokenizer.ggml.pre` with
  llama.cpp's regexes (`PRE_TYPES`).
- Token types, the end-of-generation set and strip flags are llama.cpp's after its load-time overrides
  (vocab_attrs.py): CONTROL / UNKNOWN tokens are "special", USER_DEFINED ones are not.
- `encode(text, parse_special=True)` == llama.cpp `tokenize(text, add_special=add_bos, parse_special)`:
  token texts written in the text are split out first, longest first, exactly like llama.cpp's
  `tokenizer_st_partition` (with its LSTRIP / RSTRIP whitespace stripping): every CONTROL / USER_DEFINED /
  UNKNOWN token when `parse_special`, only USER_DEFINED ones otherwise. The rest is pre-tokenized and
  BPE-merged by the Rust `tokenizers` library. BOS is prepended only if `add_bos`.
- Chat message content (`encode_segments` segments marked False, `apply_chat_template(tokenize=True)`)
  matches only the tokens the GGUF itself stores as USER_DEFINED (Gemma's "\n\n", space runs, html
  tags; Qwen's `<tool_call>`): a user typing a control token's text (`<|im_end|>`, `<start_of_turn>`,
  harmony's `<|start|>`, which llama.cpp turns USER_DEFINED for output) gets plain text tokens.
- `token_bytes(id)` gives a token's exact bytes as llama.cpp's `token_to_piece(special=True)`;
  `decode(ids, skip_special_tokens)` == llama.cpp `llama_detokenize(ids, remove_special=skip,
  unparse_special=not skip)`: the first piece loses one leading space when `add_space_prefix` (unless a
  BOS removed by `remove_special` came first), llama.cpp's `clean_spaces` clean-up where the pre-tokenizer
  has it, invalid UTF-8 -> U+FFFD. Streamed output (detokenizer.py) joins `token_bytes` instead, as
  llama-server streams pieces.
- `eog_token_ids` mirrors llama.cpp's end-of-generation set (eos, eot, eom, FIM pad/repo/sep, known names,
  harmony's `<|end|>` excluded when `<|return|>` and `<|call|>` exist).
- Building is fast: GGUF metadata is read by
  `read_tokenizer_metadata`, a direct header parser (gguf.GGUFReader is far slower on these arrays), and the
  Rust BPE is built in memory (measured faster than loading a cached tokenizer.json, so nothing is cached).
- Known divergences: a byte-level piece with a character outside GPT-2's byte table (Command-R has ~1400,
  unreachable by encoding) is its UTF-8 text here, as HF decodes it; llama.cpp prints a
  "[UNK_BYTE_0x..]" placeholder for it. Code points assigned in Unicode 16 (e.g. U+13460.. Egyptian
  hieroglyphs ext-A, Todhri, Tulu-Tigalari) are letters to the `tokenizers` regex engine but unassigned in
  llama.cpp's tables, so text containing them can split differently.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from hitenter.errors import ModelLoadError
from hitenter.tokenizer.gguf_meta import read_tokenizer_metadata
from hitenter.tokenizer.meta_types import check_tokenizer_types
from hitenter.tokenizer.vocab_attrs import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    vocab_attributes,
)
from hitenter.tokenizer.vocab_cache import tokenizer_values

__all__ = ["Tokenizer", "bytes_to_unicode", "byte_decoder", "read_tokenizer_metadata", "clean_spaces",
           "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]

# The tokenizers of other GGUF vocabulary models, by tokenizer.ggml.model, each registered by its own module
# (spm.py: "llama"); hitenter/tokenizer/__init__.py imports them, so they are here whenever this module is.
VOCAB_BUILDERS: dict[str, Callable[[Mapping[str, Any]], Tokenizer]] = {}

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACT = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_QWEN2 = _CONTRACT + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACT + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_LLAMA3 = _CONTRACT + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O (o200k): its adaptation of the tokenizer.json regex, where an
# "upper" run is letters other than a-z and a "lower" run letters other than A-Z
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACT + "?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACT + "?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# llama.cpp's DEEPSEEK_LLM letter class, escaped (some of its characters change under NFC)
_DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
    "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
    "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
    "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+")
_FAMILIES: dict[str, tuple[tuple[str, ...], bool]] = {  # regexes applied in order, ignore_merges
    "smollm": ((r"\p{N}", _GPT2), False),
    "gpt2": ((_GPT2,), False),
    "qwen2": ((_QWEN2,), False),
    "qwen35": ((_QWEN35,), False),
    "llama3": ((_LLAMA3,), True),
    "gpt4o": ((_GPT4O,), False),
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), False),
    "falcon": ((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"), False),
    "deepseek-coder": (("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}"), False),
    "deepseek-llm": (("[\r\n]", _DEEPSEEK_LLM_LETTERS,
                      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$",
                      _DEEPSEEK_CJK, r"\p{N}+"), False),
}
# llama.cpp's `tokenizer.ggml.pre` names -> family (llama-vocab.cpp), for the families above.
PRE_TYPES: dict[str, str] = {
    **dict.fromkeys(["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"], "smollm"),
    **dict.fromkeys(["gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "mpt", "olmo", "jais",
                     "exaone4", "gigachat", "mellum"], "gpt2"),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "kormo"], "qwen2"),
    "qwen35": "qwen35",
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"], "llama3"),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], "gpt4o"),
    "default": "default",
    "falcon": "falcon",
    "deepseek-coder": "deepseek-coder",
    "deepseek-llm": "deepseek-llm",
}
# llama.cpp's add_bos when the GGUF has no tokenizer.ggml.add_bos_token: true for these BPE pre-tokenizers
_ADD_BOS_PRE = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                          "jina-v5-nano", "tekken", "chameleon"))
_WS = " \t\n\v\f\r"   # C isspace(): what LSTRIP / RSTRIP strip


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's inverse byte-to-unicode table: printable stand-in character -> byte value."""
    return {c: b for b, c in bytes_to_unicode().items()}


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's `llama_detokenize` clean-up, its three passes in order: a space before ? ! . , goes;
    " ' " becomes "'"; a space before 's 'm 're 've goes."""
    text = re.sub(rb" (?=[?!.,])", b"", text)
    text = text.replace(b" ' ", b"'")
    return re.sub(rb" (?='(?:[sm]|re|ve))", b"", text)


def _build_hf(tokens: Sequence[str], merges: Sequence[str], family: str) -> HFTokenizer:
    regexes, ignore_merges = _FAMILIES[family]
    vocab = {t: i for i, t in enumerate(tokens)}  # later duplicates win, as in llama.cpp
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)
    except Exception:  # odd merges (parts or result not in the vocab): keep the usable ones, as llama.cpp does
        pairs = []
        for m in merges:
            k = m.find(" ", 1)  # llama.cpp splits at the first space after position 0
            a, b = m[:k], m[k + 1:]
            if k > 0 and a in vocab and b in vocab and a + b in vocab:
                pairs.append((a, b))
        bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)
    tok = HFTokenizer(bpe)
    splits: list[Any] = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    return tok


_Table = list[tuple[str, int]]   # (token text, id), longest text first: what a partition splits out


class Tokenizer:
    """A GGUF byte-level BPE vocabulary; see the module docstring for the contracts."""

    sentencepiece_pieces = False   # a SentencePiece vocabulary's NORMAL pieces spell spaces as "\u2581"

    def __init__(self, md: Mapping[str, Any], hf: HFTokenizer) -> None:
        self._hf = hf
        self._tokens: list[str] = list(md["tokenizer.ggml.tokens"])
        attrs = vocab_attributes(md)
        self._types: list[int] = attrs.types
        self.chat_template: str | None = md.get("tokenizer.chat_template")
        n = len(self._tokens)

        def tid(key: str) -> int | None:
            v = md.get(f"tokenizer.ggml.{key}")
            return int(v) if v is not None and 0 <= int(v) < n else None

        self.bos_token_id, self.eos_token_id = tid("bos_token_id"), tid("eos_token_id")
        spm = md.get("tokenizer.ggml.model") == "llama"
        bos_default = spm or md.get("tokenizer.ggml.pre") in _ADD_BOS_PRE
        self.add_bos: bool = bool(md.get("tokenizer.ggml.add_bos_token", bos_default)) and self.bos_token_id is not None
        self.add_eos: bool = bool(md.get("tokenizer.ggml.add_eos_token", False)) and self.eos_token_id is not None
        self.add_space_prefix: bool = attrs.add_space_prefix
        self.clean_spaces: bool = attrs.clean_spaces
        self.eot_token_id = attrs.eot
        self.eog_token_ids: frozenset[int] = attrs.eog
        self._lstrip, self._rstrip = attrs.lstrip, attrs.rstrip
        order = sorted((i for i, t in enumerate(self._types)
                        if t in (CONTROL, USER_DEFINED, UNKNOWN) and self._tokens[i]),
                       key=lambda i: -len(self._tokens[i].encode()))
        self._specials: _Table = [(self._tokens[i], i) for i in order]
        self._user_defined: _Table = [(t, i) for t, i in self._specials if self._types[i] == USER_DEFINED]
        self._content: _Table = [(t, i) for t, i in self._user_defined if attrs.file_types[i] == USER_DEFINED]
        content_ids = {i for _, i in self._content}
        self._forbidden: _Table = [(t, i) for t, i in self._specials if i not in content_ids]
        self._token_bytes: dict[int, bytes] = {}

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF path or metadata mapping (its lazily decoded string arrays read here); raises ModelLoadError for unsupported vocabularies
        and for tokenizer keys of the wrong type (hitenter/tokenizer/meta_types.py)."""
        md = read_tokenizer_metadata(source) if isinstance(source, (str, os.PathLike)) else tokenizer_values(source)
        check_tokenizer_types(md)
        kind = md.get("tokenizer.ggml.model")
        if kind in VOCAB_BUILDERS and cls is Tokenizer:   # "llama": SentencePiece-BPE (Gemma), spm.py
            return VOCAB_BUILDERS[kind](md)
        if kind != "gpt2":
            raise ModelLoadError(f"tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
        pre = md.get("tokenizer.ggml.pre") or "default"
        family = PRE_TYPES.get(pre)
        if family is None:
            raise ModelLoadError(f"unsupported pre-tokenizer {pre!r}; supported: {', '.join(sorted(PRE_TYPES))}")
        tokens, merges = md.get("tokenizer.ggml.tokens"), md.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ModelLoadError("GGUF has no tokenizer.ggml.tokens / tokenizer.ggml.merges")
        return cls(md, _build_hf(tokens, merges, family))

    # ---- vocabulary ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def id_to_piece(self, token_id: int) -> str:
        """The token's vocabulary string as stored in the GGUF (byte-level form, e.g. 'Ġhello')."""
        return self._tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """True for CONTROL / UNKNOWN tokens (incl. llama.cpp's auto-detected ones); user-defined are not."""
        return self._types[token_id] in (CONTROL, UNKNOWN)

    def token_bytes(self, token_id: int) -> bytes:
        """Exact bytes of one token (a SentencePiece vocabulary's NORMAL pieces with "\u2581" as spaces)."""
        b = self._token_bytes.get(token_id)
        if b is None:
            piece, kind = self._tokens[token_id], self._types[token_id]
            if self.sentencepiece_pieces and kind == NORMAL:
                b = piece.replace("\u2581", " ").encode("utf-8")
            elif kind == UNUSED:
                b = b""
            elif kind in (CONTROL, USER_DEFINED, UNKNOWN):
                b = piece.encode("utf-8")
            elif kind == BYTE and len(piece) == 6 and piece.startswith("<0x"):
                b = bytes([int(piece[3:5], 16)])
            else:
                table = byte_decoder()
                known = all(c in table for c in piece)   # else the piece's UTF-8, as HF's ByteLevel decoder
                b = bytes(table[c] for c in piece) if known else piece.encode("utf-8")
            self._token_bytes[token_id] = b
        return b

    # ---- encode / decode ----------------------------------------------------------------------
    def _split(self, frag: str, tok: str, tid: int) -> list[str | int]:
        """`frag` split at every `tok`, with llama.cpp's LSTRIP / RSTRIP whitespace stripping."""
        parts = frag.split(tok)
        out: list[str | int] = []
        for k, part in enumerate(parts):
            if k and tid in self._rstrip:
                part = part.lstrip(_WS)
            if k < len(parts) - 1 and tid in self._lstrip:
                part = part.rstrip(_WS)
            if k:
                out.append(tid)
            if part:
                out.append(part)
        return out

    def _partition(self, text: str, table: _Table) -> list[str | int]:
        """llama.cpp's tokenizer_st_partition: the `table` tokens in `text` split out, longest first."""
        frags: list[str | int] = [text]
        for tok, tid in table:
            if not any(isinstance(f, str) and tok in f for f in frags):
                continue
            out: list[str | int] = []
            for f in frags:
                out.extend(self._split(f, tok, tid) if isinstance(f, str) and tok in f else (f,))
            frags = out
        return frags

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text` (see the module docstring): every special token's text parsed, or only the
        user-defined ones when not `parse_special`; BOS first iff `add_bos` (default: GGUF's)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() expects str, got {type(text).__name__}")
        return self._encode_frags(self._partition(text, self._specials if parse_special else self._user_defined),
                                  add_bos)

    def contains_special(self, text: str) -> bool:
        """Whether `text` holds the text of a token that message content must not produce (any special
        token but the GGUF's own user-defined ones)."""
        return any(tok in text for tok, _ in self._forbidden)

    def encode_segments(self, segments: Sequence[tuple[str, bool]], add_bos: bool | None = None) -> list[int]:
        """Encode the concatenation of `segments`: every special token's text is parsed in those marked True
        (markup), only the GGUF's user-defined tokens in those marked False (message content)."""
        frags: list[str | int] = []
        for text, markup in segments:
            frags.extend(self._partition(text, self._specials if markup else self._content) if text else ())
        return self._encode_frags(frags, add_bos)

    def _encode_frags(self, parts: Sequence[str | int], add_bos: bool | None) -> list[int]:
        """Token ids of partitioned text; adjacent text fragments are BPE-merged as one string."""
        frags: list[str | int] = []
        for f in parts:
            if isinstance(f, str) and frags and isinstance(frags[-1], str):
                frags[-1] += f
            else:
                frags.append(f)
        raw = [f for f in frags if isinstance(f, str)]
        encs = iter(self._hf.encode_batch(raw, add_special_tokens=False) if raw else [])
        ids: list[int] = [self.bos_token_id] if (self.add_bos if add_bos is None else add_bos) else []  # type: ignore[list-item]
        for f in frags:
            ids.extend(next(encs).ids if isinstance(f, str) else (f,))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """llama.cpp's `llama_detokenize(ids, remove_special=skip_special_tokens, unparse_special=not
        skip_special_tokens)` (see the module docstring); invalid UTF-8 -> U+FFFD."""
        ids = list(ids)
        strip_space = self.add_space_prefix
        if skip_special_tokens and self.add_bos and ids and ids[0] == self.bos_token_id:
            ids, strip_space = ids[1:], False
        if skip_special_tokens and self.add_eos and ids and ids[-1] == self.eos_token_id:
            ids = ids[:-1]
        parts = [b"" if skip_special_tokens and self.is_special(i) else self.token_bytes(i) for i in ids]
        if strip_space and parts and parts[0].startswith(b" "):
            parts[0] = parts[0][1:]
        data = b"".join(parts)
        return (clean_spaces(data) if self.clean_spaces else data).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            tokenize: bool = False, special_in_content: bool = False,
                            **kwargs: Any) -> str | list[int]:
        """Render `messages` with the GGUF's chat template; token ids (no extra BOS) when `tokenize`.

        Token ids keep message content as text but for the GGUF's user-defined tokens: only the
        template's own markup yields control tokens (a user writing `<|im_end|>` cannot forge a turn),
        unless `special_in_content` (trusted callers). The text form is the plain rendering either way."""
        from hitenter.tokenizer.chat_template import render_chat_segments, render_chat_template

        kwargs.setdefault("bos_token", self._tokens[self.bos_token_id] if self.bos_token_id is not None else "")
        kwargs.setdefault("eos_token", self._tokens[self.eos_token_id] if self.eos_token_id is not None else "")
        if not tokenize:
            return render_chat_template(self.chat_template, messages, add_generation_prompt, **kwargs)
        if special_in_content:
            text = render_chat_template(self.chat_template, messages, add_generation_prompt, **kwargs)
            return self.encode(text, add_bos=False)
        segments = render_chat_segments(self.chat_template, messages, self.contains_special,
                                        add_generation_prompt, **kwargs)
        return self.encode_segments(segments, add_bos=False)
