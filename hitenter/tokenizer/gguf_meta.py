"""GGUF key/values read straight from the file header (much faster than gguf.GGUFReader for the
100k-entry string arrays of a tokenizer)."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from hitenter.errors import ModelLoadError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_tokenizer_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All GGUF key/values (v2/v3, little-endian) as plain Python values, parsed straight from the header.

    Much faster than `gguf.GGUFReader` for 100k-entry string arrays (no per-element numpy views).
    Raises ModelLoadError for a missing, non-GGUF, truncated or corrupt file.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if mm[:4] != b"GGUF":
                raise ModelLoadError(f"{p} is not a GGUF file (magic {mm[:4]!r})")
            version, _n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
            if version < 2:
                raise ModelLoadError(f"{p}: GGUF version {version} is too old")
            off, out = 24, {}
            unpack = struct.unpack_from

            def string(o: int) -> tuple[str, int]:
                (n,) = unpack("<Q", mm, o)
                return mm[o + 8:o + 8 + n].decode("utf-8", "replace"), o + 8 + n

            def value(t: int, o: int) -> tuple[Any, int]:
                if t == 8:
                    return string(o)
                if t in _SCALARS:
                    return unpack(_SCALARS[t], mm, o)[0], o + struct.calcsize(_SCALARS[t])
                if t != 9:
                    raise ValueError(f"unknown value type {t}")
                et, n = unpack("<IQ", mm, o)
                o += 12
                if et in _SCALARS:
                    dt = np.dtype(_SCALARS[et].replace("?", "u1"))
                    arr = np.frombuffer(mm, dtype=dt, count=n, offset=o)
                    return (arr.astype(bool) if et == 7 else arr).tolist(), o + n * dt.itemsize
                items = []
                for _ in range(n):
                    v, o = value(et, o)
                    items.append(v)
                return items, o

            for _ in range(n_kv):
                key, off = string(off)
                (vt,) = unpack("<I", mm, off)
                out[key], off = value(vt, off + 4)
            return out
    except ModelLoadError:
        raise
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {p}") from None
    except (OSError, ValueError, struct.error, IndexError) as e:
        raise ModelLoadError(f"{p} is truncated or corrupt: {type(e).__name__}: {e}") from e
