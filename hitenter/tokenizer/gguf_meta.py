"""GGUF key/values read straight from the file header (much faster than gguf.GGUFReader for the
100k-entry string arrays of a tokenizer), every length checked against the file before it is used."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from hitenter.errors import ModelLoadError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_MIN_KV_BYTES = 8 + 4 + 1          # key length, value type, the smallest value
_MAX_KEY_BYTES = 1 << 16


class _Header:
    """A bounds-checked cursor over a GGUF header in memory (`buf`); every read past the end, count that
    cannot fit the bytes left, unknown or nested type is a ModelLoadError."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.size = buf, len(buf)

    def need(self, end: int, what: str) -> None:
        if end > self.size:
            raise ModelLoadError(f"{what} runs past the end of the file (byte {end} of {self.size}): "
                                 "the file is truncated or corrupt")

    def fits(self, count: int, item_bytes: int, off: int, what: str) -> None:
        if count * item_bytes > self.size - off:
            raise ModelLoadError(f"the header claims {count} {what}, more than the {self.size - off} bytes left "
                                 "in the file can hold: the file is truncated or corrupt")

    def unpack(self, fmt: str, off: int, what: str) -> tuple[Any, ...]:
        self.need(off + struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, off)

    def raw_string(self, off: int, what: str) -> tuple[bytes, int]:
        (n,) = self.unpack("<Q", off, what)
        self.need(off + 8 + n, f"{what} ({n} bytes)")
        return bytes(self.buf[off + 8:off + 8 + n]), off + 8 + n

    def value(self, t: int, off: int, key: str) -> tuple[Any, int]:
        if t == _STRING:
            raw, off = self.raw_string(off, f"the string value of {key!r}")
            return raw.decode("utf-8", "replace"), off
        if t in _SCALARS:
            return self.unpack(_SCALARS[t], off, f"the value of {key!r}")[0], off + struct.calcsize(_SCALARS[t])
        if t != _ARRAY:
            raise ModelLoadError(f"metadata key {key!r} has the unknown value type {t}: the file is corrupt")
        et, n = self.unpack("<IQ", off, f"the array header of {key!r}")
        off += 12
        if et not in _SCALARS and et != _STRING:
            raise ModelLoadError(f"metadata key {key!r} is an array of the unknown or nested type {et}: "
                                 "the file is corrupt")
        item = struct.calcsize(_SCALARS[et]) if et in _SCALARS else 8
        self.fits(n, item, off, f"entries in the array {key!r}")
        if et in _SCALARS:
            dt = np.dtype(_SCALARS[et].replace("?", "u1"))
            arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=off)
            return (arr.astype(bool) if et == 7 else arr).tolist(), off + n * dt.itemsize
        return self.strings(n, off, key)

    def strings(self, n: int, off: int, key: str) -> tuple[list[str], int]:
        """`n` strings (each a u64 length, then its bytes) from `off`: the list and the offset after them."""
        buf, size, unpack = self.buf, self.size, _U64.unpack_from
        items: list[Any] = [None] * n
        for i in range(n):
            if off + 8 > size:
                self.need(off + 8, f"string {i} of {key!r}")
            (k,) = unpack(buf, off)
            end = off + 8 + k
            if end > size:
                self.need(end, f"string {i} of {key!r} ({k} bytes)")
            items[i] = buf[off + 8:end]
            off = end
        return [b.decode("utf-8", "replace") for b in items], off

    def key(self, off: int) -> tuple[str, int]:
        (n,) = self.unpack("<Q", off, "a metadata key")
        if n > _MAX_KEY_BYTES:
            raise ModelLoadError(f"a metadata key at byte {off} claims {n} bytes: the file is corrupt")
        raw, off = self.raw_string(off, "a metadata key")
        try:
            return raw.decode("utf-8"), off
        except UnicodeDecodeError:
            raise ModelLoadError(f"the metadata key {raw[:60]!r} is not valid UTF-8: the file is corrupt") from None


def read_tokenizer_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All GGUF key/values (v2/v3, little-endian) as plain Python values, parsed straight from the header.

    Much faster than `gguf.GGUFReader` for 100k-entry string arrays (no per-element numpy views).
    String values with invalid UTF-8 read with U+FFFD (llama.cpp does not check them either); keys must
    be UTF-8 and unique. Raises a one-line ModelLoadError for a missing, non-GGUF, truncated or corrupt
    file: any count or length the bytes left cannot hold fails before it is looped over or allocated.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if mm[:4] != b"GGUF":
                raise ModelLoadError(f"{p} is not a GGUF file (magic {mm[:4]!r})")
            h = _Header(mm)
            version, _n_tensors, n_kv = h.unpack("<IQQ", 4, "the GGUF header")
            if version not in (2, 3):
                raise ModelLoadError(f"{p}: GGUF version {version} is not supported (2 or 3)")
            h.fits(n_kv, _MIN_KV_BYTES, 24, "metadata key/values")
            off, out = 24, {}
            for _ in range(n_kv):
                key, off = h.key(off)
                if key in out:
                    raise ModelLoadError(f"the metadata key {key[:60]!r} appears twice: the file is corrupt")
                (vt,) = h.unpack("<I", off, f"the type of {key!r}")
                out[key], off = h.value(vt, off + 4, key)
            return out
    except ModelLoadError as e:
        msg = str(e) if str(e).startswith(str(p)) else f"{p}: {e}"
        raise ModelLoadError(" ".join(msg.split())) from None
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {p}") from None
    except (OSError, ValueError, struct.error, IndexError) as e:
        raise ModelLoadError(f"{p} is truncated or corrupt: {type(e).__name__}: {e}") from e
