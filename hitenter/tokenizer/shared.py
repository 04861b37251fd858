"""One tokenizer per GGUF file in a process: `shared_tokenizer(path)` returns the tokenizer already built for
the same unchanged file (its real path, size, modification time and inode) while anything still holds it,
else builds one (from `metadata` when the caller has parsed the header, else from the file) and keeps a weak
reference to it. Engines on one file, and the playground's trigram toy (which reads the default model's
vocabulary), then share one vocabulary in memory. A tokenizer is not changed after it is built (its caches
only fill, with the same values whoever fills them), so engines on different threads may share it."""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

from hitenter.tokenizer.bpe import Tokenizer

_LIVE: weakref.WeakValueDictionary[tuple[str, int, int, int], Tokenizer] = weakref.WeakValueDictionary()


def _identity(path: str | os.PathLike[str]) -> tuple[str, int, int, int] | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return real, st.st_size, st.st_mtime_ns, st.st_ino


def shared_tokenizer(path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None) -> Tokenizer:
    """The tokenizer of the GGUF at `path` (`metadata`: its key/values, already read; ModelLoadError as
    `Tokenizer.from_gguf` raises it)."""
    key = _identity(path)
    tok = _LIVE.get(key) if key is not None else None
    if tok is None:
        tok = Tokenizer.from_gguf(metadata if metadata is not None else path)
        if key is not None:
            _LIVE[key] = tok
    return tok
