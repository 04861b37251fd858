"""One vocabulary per GGUF file in a process: `shared_tokenizer(path)` gives each caller its own Tokenizer
object over the vocabulary already built for the same unchanged file (its real path, size, modification time
and inode) while any such object lives, else builds it (from `metadata` when the caller has parsed the
header, else from the file; either way through the key/values cached on disk, tokenizer/vocab_cache.py).
Engines on one file, and the playground's trigram toy (which reads the default
model's vocabulary), then hold one vocabulary in memory.

Each caller's object is a shallow copy of a prototype nobody else is given: an attribute set on one (an
engine's `chat_template`) stays with it. What the copies share (the byte-level BPE, the token lists, the
token-bytes cache) is never changed after the build, apart from caches that fill with the same values
whoever fills them, so engines on different threads may share it."""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import Mapping
from typing import Any

from hitenter.tokenizer.bpe import Tokenizer
from hitenter.tokenizer.gguf_meta import read_tokenizer_metadata
from hitenter.tokenizer.vocab_cache import load_vocab, store_vocab, tokenizer_values

_LIVE: weakref.WeakValueDictionary[tuple[str, int, int, int], Tokenizer] = weakref.WeakValueDictionary()


def _identity(path: str | os.PathLike[str]) -> tuple[str, int, int, int] | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return real, st.st_size, st.st_mtime_ns, st.st_ino


def _build(path: str | os.PathLike[str], metadata: Mapping[str, Any] | None) -> Tokenizer:
    """The tokenizer of the GGUF at `path`: from its cached key/values when valid (hitenter/tokenizer/
    vocab_cache.py), else from `metadata` or the header, then cached. A cached copy the tokenizer cannot be
    built from is ignored and written again from the header."""
    cached = load_vocab(path)
    if cached is not None:
        try:
            return Tokenizer.from_gguf(cached)
        except Exception:   # a copy that reads but does not build: the header decides, as without a cache
            pass
    md = tokenizer_values(metadata if metadata is not None else read_tokenizer_metadata(path))
    tok = Tokenizer.from_gguf(md)
    store_vocab(path, md)
    return tok


def shared_tokenizer(path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None) -> Tokenizer:
    """A tokenizer of the GGUF at `path` of the caller's own (`metadata`: its key/values, already read;
    ModelLoadError as `Tokenizer.from_gguf` raises it)."""
    key = _identity(path)
    proto = _LIVE.get(key) if key is not None else None
    if proto is None:
        proto = _build(path, metadata)
        if key is None:
            return proto
        _LIVE[key] = proto
    tok = copy.copy(proto)
    tok.shared_vocabulary = proto   # the prototype (and its cache entry) lives while this copy does
    return tok
