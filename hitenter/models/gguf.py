"""Reading GGUF files: metadata, model config and dequantized tensors (through the `gguf` package)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from hitenter.errors import ModelLoadError


def open_gguf(path: str | os.PathLike[str]) -> gguf.GGUFReader:
    """Open a GGUF file, turning every failure into a ModelLoadError that names the problem."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelLoadError(f"model path is a directory, expected a .gguf file: {p}")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{p} is not a GGUF file (magic bytes {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(str(p))
    except Exception as e:  # the gguf package raises ValueError/IndexError/struct errors on damage
        raise ModelLoadError(f"{p} is truncated or corrupt: {type(e).__name__}: {e}") from e


def _field_value(field: Any) -> Any:
    v = field.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


def read_gguf_metadata(reader_or_path: gguf.GGUFReader | str | os.PathLike[str]) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values (str, int, float, bool, list)."""
    reader = reader_or_path if isinstance(reader_or_path, gguf.GGUFReader) else open_gguf(reader_or_path)
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = _field_value(field)
        except Exception as e:
            raise ModelLoadError(f"GGUF metadata key {key!r} is corrupt: {e}") from e
    return out
