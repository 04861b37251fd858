"""A GGUF's tokenizer key/values (`tokenizer.*`: the vocabulary, its merges, token types, scores, chat
template, special ids; and `general.name`, which llama.cpp's strip flags read) kept on disk beside the
weight arena, so a load whose file is unchanged reads them as one JSON document instead of decoding the
header's string arrays.

`load_vocab(path)` gives the cached key/values of the GGUF at `path`, or None when there is no valid copy:
switched off (`HITENTER_WEIGHT_CACHE=0`), a vocabulary under `MIN_TOKENS`, no file, another GGUF (its real
path, size, modification time and inode are the key), another cache format, a truncated or altered file
(its payload's length and SHA-1 are checked) or anything that does not read as a mapping of `tokenizer.*`
keys (and `general.name`). The caller then builds from the header and calls `store_vocab`, which writes the
file again through a temporary file renamed over it (`os.replace`), so concurrent writers leave one whole
file and a reader never sees a partial one; the files of GGUFs that no longer exist go then. The values are
the header's own, unchanged; the tokenizer is built from them exactly as from the header
(hitenter/tokenizer/bpe.py `Tokenizer.from_gguf`), so its ids are the same.

The file: `MAGIC`, one line of JSON (`key`, payload `bytes` and `sha1`), then the payload: the key/values as
UTF-8 JSON. Stored under `<HITENTER_HOME>/tokenizers/<name>-<path hash>.vocab`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hitenter import envs
from hitenter.paths import hitenter_home

log = logging.getLogger("hitenter.tokenizer")

FORMAT = 1
MAGIC = b"HITENTER-VOCAB\n"
MIN_TOKENS = 4096          # smaller vocabularies decode from the header in a few milliseconds
_PREFIX = "tokenizer."
_NAME = "general.name"
_MAX_HEAD = 1 << 16


def cache_dir() -> Path:
    return hitenter_home() / "tokenizers"


def _key(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]] | None:
    try:
        real = Path(path).resolve()
        st = real.stat()
    except (OSError, ValueError):
        return None
    return real, {"source": str(real), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                  "format": FORMAT}


def _file(real: Path) -> Path:
    return cache_dir() / f"{real.stem}-{hashlib.sha1(str(real).encode()).hexdigest()[:12]}.vocab"


def load_vocab(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The cached tokenizer key/values of the GGUF at `path`; None when there is no valid copy."""
    found = _key(path) if envs.HITENTER_WEIGHT_CACHE.get() else None
    if found is None:
        return None
    real, key = found
    try:
        data = _file(real).read_bytes()
        if not data.startswith(MAGIC):
            return None
        end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEAD)
        head = json.loads(data[len(MAGIC):end]) if end > 0 else None
        if not isinstance(head, dict) or head.get("key") != key:
            return None
        payload = memoryview(data)[end + 1:]
        if len(payload) != head.get("bytes") or hashlib.sha1(payload).hexdigest() != head.get("sha1"):
            return None
        md = json.loads(str(payload, "utf-8"))
    except (OSError, ValueError):   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if not isinstance(md, dict) or not all(isinstance(k, str) and _wanted(k) for k in md):
        return None
    tokens = md.get(_PREFIX + "ggml.tokens")
    return md if isinstance(tokens, list) and len(tokens) >= MIN_TOKENS else None


def _wanted(key: str) -> bool:
    return key.startswith(_PREFIX) or key == _NAME


def tokenizer_values(md: Mapping[str, Any]) -> dict[str, Any]:
    """The key/values of `md` a tokenizer reads (`tokenizer.*`, `general.name`) as plain Python values (a
    lazily decoded string array, hitenter/models/gguf.py GGUFStrings, as a list)."""
    return {k: list(v) if isinstance(v, Sequence) and not isinstance(v, str | bytes | list | tuple) else v
            for k, v in md.items() if _wanted(k)}


def store_vocab(path: str | os.PathLike[str], md: Mapping[str, Any]) -> None:
    """Write the tokenizer's key/values of `md` (read from the GGUF at `path`) to its cache file; nothing
    when caching does not apply (switched off, a small vocabulary) or the file cannot be written."""
    found = _key(path) if envs.HITENTER_WEIGHT_CACHE.get() else None
    values = tokenizer_values(md)
    if found is None or len(values.get(_PREFIX + "ggml.tokens") or ()) < MIN_TOKENS:
        return
    real, key = found
    target = _file(real)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        payload = json.dumps(values, ensure_ascii=False).encode("utf-8")
        head = json.dumps({"key": key, "bytes": len(payload), "sha1": hashlib.sha1(payload).hexdigest()})
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(target.parent)
        with open(tmp, "wb") as f:
            f.write(MAGIC + head.encode() + b"\n" + payload)
        os.replace(tmp, target)
    except (OSError, ValueError, TypeError) as e:   # a full disk, a read-only home, a value JSON cannot hold
        log.info("tokenizer cache: could not write %s (%s)", target, e)
        tmp.unlink(missing_ok=True)


def _source(path: Path) -> str | None:
    """The GGUF path a cache file names, None when its first line cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + _MAX_HEAD)
        end = head.find(b"\n", len(MAGIC))
        source = json.loads(head[len(MAGIC):end]).get("key", {}).get("source") if head.startswith(MAGIC) else None
    except (OSError, ValueError, AttributeError):
        return None
    return source if isinstance(source, str) else None


def _remove_orphans(folder: Path) -> None:
    """Remove the cache files whose GGUF is gone (or that do not read), and temporary files of a process
    that died."""
    for p in folder.iterdir():
        if p.name.startswith(".") and p.name.endswith(".tmp"):
            pid = p.name.rsplit(".", 4)[-3]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                p.unlink(missing_ok=True)
        elif p.suffix == ".vocab":
            source = _source(p)
            if source is None or not Path(source).exists():
                p.unlink(missing_ok=True)
