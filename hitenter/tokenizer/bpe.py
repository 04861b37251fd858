"""Byte-level BPE tokenizer built from a GGUF vocabulary, matching llama.cpp's token ids exactly.

Contracts:
- `Tokenizer.from_gguf(path_or_metadata)` accepts a GGUF path or a metadata dict (as from
  `read_gguf_metadata` / `read_tokenizer_metadata`). Only `tokenizer.ggml.model == "gpt2"` (byte-level BPE)
  is supported; the pre-tokenizer is chosen by `tokenizer.ggml.pre` with llama.cpp's regexes.
- `encode(text)` == llama.cpp `tokenize(text, add_special=add_bos, parse_special=True)`: special tokens
  (CONTROL / USER_DEFINED / UNKNOWN types, plus llama.cpp's auto-detected EOG / FIM names) written in the text
  are split out first, longest token text first, exactly like llama.cpp's `tokenizer_st_partition`; the rest
  is pre-tokenized and BPE-merged by the Rust `tokenizers` library. BOS is prepended only if `add_bos`.
- `token_bytes(id)` gives a token's exact bytes (byte-level pieces mapped back through GPT-2's byte table,
  special and user-defined tokens -> their UTF-8 text); `decode` joins those bytes and decodes UTF-8 with
  replacement. `skip_special_tokens` drops CONTROL/UNKNOWN tokens (user-defined ones are kept, as llama.cpp).
- `eog_token_ids` mirrors llama.cpp's end-of-generation set (eos, eot, eom, FIM pad/repo/sep, known names).
- Building is fast (SmolLM2 ~0.1 s, Qwen2.5 151k vocab ~0.5 s): GGUF metadata is read by
  `read_tokenizer_metadata`, a direct header parser (gguf.GGUFReader needs ~3 s for these arrays), and the
  Rust BPE is built in memory (measured faster than loading a cached tokenizer.json, so nothing is cached).
- Known divergence: code points assigned in Unicode 16 (e.g. U+13460.. Egyptian hieroglyphs ext-A, Todhri,
  Tulu-Tigalari) are letters to the `tokenizers` regex engine but unassigned in llama.cpp's tables, so text
  containing them can split differently. No other differences were found (6000 random fuzz strings).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from hitenter.errors import ModelLoadError
from hitenter.tokenizer.gguf_meta import read_tokenizer_metadata

__all__ = ["Tokenizer", "bytes_to_unicode", "byte_decoder", "read_tokenizer_metadata"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACT = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_QWEN2 = _CONTRACT + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTRACT + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_FAMILIES: dict[str, tuple[tuple[str, ...], bool]] = {  # regexes applied in order, ignore_merges
    "smollm": ((r"\p{N}", _GPT2), False),
    "gpt2": ((_GPT2,), False),
    "qwen2": ((_QWEN2,), False),
    "llama3": ((_LLAMA3,), True),
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), False),
}
# llama.cpp's `tokenizer.ggml.pre` names -> family (llama-vocab.cpp), for the families above.
PRE_TYPES: dict[str, str] = {
    **dict.fromkeys(["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"], "smollm"),
    **dict.fromkeys(["gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "mpt", "olmo", "jais",
                     "exaone4", "gigachat", "mellum"], "gpt2"),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "kormo"], "qwen2"),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"], "llama3"),
    "default": "default",
}

# llama.cpp auto-detection by token text (llama-vocab.cpp, load()): these become CONTROL; some are EOG.
_EOT_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM_NAMES: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
_EOG_NAMES = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                        "<｜end▁of▁sentence｜>", "[e~["))


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


class Tokenizer:
    """A GGUF byte-level BPE vocabulary; see the module docstring for the contracts."""

    def __init__(self, md: Mapping[str, Any], hf: HFTokenizer) -> None:
        self._hf = hf
        self._tokens: list[str] = list(md["tokenizer.ggml.tokens"])
        n = len(self._tokens)
        types = md.get("tokenizer.ggml.token_type")
        self._types: list[int] = list(types) if types is not None else [NORMAL] * n
        if len(self._types) != n:
            raise ModelLoadError(f"tokenizer.ggml.token_type has {len(self._types)} entries for {n} tokens")
        self.chat_template: str | None = md.get("tokenizer.chat_template")

        def tid(key: str) -> int | None:
            v = md.get(f"tokenizer.ggml.{key}")
            return int(v) if v is not None and 0 <= int(v) < n else None

        self.bos_token_id, self.eos_token_id = tid("bos_token_id"), tid("eos_token_id")
        self.add_bos: bool = bool(md.get("tokenizer.ggml.add_bos_token", False)) and self.bos_token_id is not None
        ids_by_text = {t: i for i, t in enumerate(self._tokens)}  # later duplicates win, as in llama.cpp
        found: dict[str, int | None] = {k: tid(f"{k}_token_id") for k in ("eot", "eom")}
        found.update({k: tid(f"fim_{k}_token_id") for k in _FIM_NAMES})
        names = {"eot": _EOT_NAMES, "eom": ("<|eom_id|>",), **_FIM_NAMES}
        for slot, cands in names.items():
            if found[slot] is None:
                hits = [ids_by_text[c] for c in cands if c in ids_by_text]
                found[slot] = min(hits) if hits else None
                if hits:
                    self._types[found[slot]] = CONTROL  # type: ignore[index]
        eog = {v for v in (found["pad"], found["rep"], found["sep"], self.eos_token_id, found["eot"], found["eom"])
               if v is not None}
        for i in (ids_by_text[name] for name in _EOG_NAMES if name in ids_by_text):
            eog.add(i)
            self._types[i] = CONTROL
        self.eot_token_id = found["eot"]
        self.eog_token_ids: frozenset[int] = frozenset(eog)
        specials = [i for i, t in enumerate(self._types) if t in (CONTROL, USER_DEFINED, UNKNOWN) and self._tokens[i]]
        specials.sort(key=lambda i: -len(self._tokens[i].encode()))
        self._specials: list[tuple[str, int]] = [(self._tokens[i], i) for i in specials]
        self._token_bytes: dict[int, bytes] = {}

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF path or metadata mapping; raises ModelLoadError for unsupported vocabularies."""
        md = read_tokenizer_metadata(source) if isinstance(source, (str, os.PathLike)) else source
        kind = md.get("tokenizer.ggml.model")
        if kind == "llama" and cls is Tokenizer:   # SentencePiece-BPE with byte fallback (Gemma): spm.py
            from hitenter.tokenizer.spm import SpmTokenizer, build_spm

            return SpmTokenizer(md, build_spm(md))
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
        """Exact bytes of one token."""
        b = self._token_bytes.get(token_id)
        if b is None:
            piece, kind = self._tokens[token_id], self._types[token_id]
            if kind == UNUSED:
                b = b""
            elif kind in (CONTROL, USER_DEFINED, UNKNOWN):
                b = piece.encode("utf-8")
            elif kind == BYTE and len(piece) == 6 and piece.startswith("<0x"):
                b = bytes([int(piece[3:5], 16)])
            else:
                table = byte_decoder()
                b = b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in piece)
            self._token_bytes[token_id] = b
        return b

    # ---- encode / decode ----------------------------------------------------------------------
    def _partition(self, text: str) -> list[str | int]:
        frags: list[str | int] = [text]
        for tok, tid in self._specials:
            if not any(isinstance(f, str) and tok in f for f in frags):
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok not in f:
                    out.append(f)
                    continue
                for k, part in enumerate(f.split(tok)):
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            frags = out
        return frags

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, special tokens in the text parsed as such (unless not `parse_special`: then
        `<|im_end|>` is plain text); BOS first iff `add_bos` (default: GGUF's)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() expects str, got {type(text).__name__}")
        return self.encode_segments([(text, parse_special)], add_bos)

    def contains_special(self, text: str) -> bool:
        """Whether `text` holds the text of a special (control / user-defined) token."""
        return any(tok in text for tok, _ in self._specials)

    def encode_segments(self, segments: Sequence[tuple[str, bool]], add_bos: bool | None = None) -> list[int]:
        """Encode the concatenation of `segments`; special-token text is parsed only in those marked True.
        Adjacent text is BPE-merged as one string, so marking changes ids only where special text is."""
        frags: list[str | int] = []
        for text, parse in segments:
            for f in (self._partition(text) if parse else [text]) if text else []:
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
        """Text of `ids` (invalid UTF-8 -> U+FFFD); special tokens dropped when `skip_special_tokens`."""
        return b"".join(
            self.token_bytes(i) for i in ids if not (skip_special_tokens and self.is_special(i))
        ).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            tokenize: bool = False, special_in_content: bool = False,
                            **kwargs: Any) -> str | list[int]:
        """Render `messages` with the GGUF's chat template; token ids (no extra BOS) when `tokenize`.

        Token ids keep message content as plain text: only the template's own markup yields control
        tokens (a user writing `<|im_end|>` cannot forge a turn), unless `special_in_content` (trusted
        callers). The text form is the plain rendering either way."""
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
