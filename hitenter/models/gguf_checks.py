"""The structural checks a GGUF header must pass before anything is allocated or mapped from it.

A GGUF is a file from a stranger: every count, length, offset, shape and type it states is checked
against the file's size and the format's rules (llama.cpp's gguf.cpp states the same ones) before it is
used. Each failed check raises ModelLoadError with one line naming the problem; no check allocates more
than the header already occupies.

Contracts:
- `need(end, size, what)`: a read ending at `end` must lie within a file of `size` bytes.
- `check_count(count, min_bytes, left, what)`: a header count of items each at least `min_bytes` long
  must fit the `left` bytes of the file (a header claiming 2^60 tensors fails here, at once).
- `decode_name(raw, what)`: a key or tensor name as strict UTF-8 with no control characters.
- `check_tensor_table(tensors, data_offset, alignment, size)`: every tensor's type is known, its dims are
  at most GGML_MAX_DIMS, its row length is a whole number of blocks, its element count and byte size
  do not overflow, its data is aligned, lies within the file and overlaps no other tensor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gguf

from hitenter.errors import ModelLoadError

MAX_DIMS = 4                 # GGML_MAX_DIMS
MAX_NAME_BYTES = 63          # GGML_MAX_NAME - 1: the longest tensor name ggml holds
MAX_KEY_BYTES = 1 << 16      # a metadata key longer than this is damage, not a key
MIN_KV_BYTES = 8 + 4 + 1     # key length, value type, the smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8   # name length, dim count, type, offset (no name, no dims)
INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table as the file states it (dims in ggml `ne` order, `offset` relative
    to the data section)."""

    name: str
    dims: tuple[int, ...]
    raw_type: int
    offset: int


def short(text: object, limit: int = 80) -> str:
    """`text`'s repr cut to `limit` characters: a hostile name can neither flood nor split a message."""
    r = repr(text)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def need(end: int, size: int, what: str) -> None:
    """ModelLoadError unless a read ending at byte `end` lies within a file of `size` bytes."""
    if end > size:
        raise ModelLoadError(f"{what} runs past the end of the file (byte {end} of {size}): "
                             "the file is truncated or corrupt")


def check_count(count: int, min_bytes: int, left: int, what: str) -> None:
    """ModelLoadError unless `count` items of at least `min_bytes` each fit in `left` bytes."""
    if count * min_bytes > left:
        raise ModelLoadError(f"the header claims {count} {what}, more than the {left} bytes left in the file "
                             "can hold: the file is truncated or corrupt")


def decode_name(raw: bytes, what: str) -> str:
    """`raw` as strict UTF-8 without control characters; ModelLoadError naming `what` otherwise."""
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{what} {short(raw)} is not valid UTF-8 ({e.reason} at byte {e.start}): "
                             "the file is corrupt") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ModelLoadError(f"{what} {short(name)} contains control characters: the file is corrupt")
    return name


def tensor_nbytes(t: TensorInfo) -> int:
    """Bytes of `t`'s data; ModelLoadError for an unknown type, more than MAX_DIMS dims, a row that is not
    whole blocks or an element count past int64."""
    try:
        qtype = gguf.GGMLQuantizationType(t.raw_type)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ModelLoadError(f"tensor {short(t.name)} has the unknown GGML type {t.raw_type}: "
                             "the file is corrupt or from a newer llama.cpp") from None
    if len(t.dims) > MAX_DIMS:
        raise ModelLoadError(f"tensor {short(t.name)} has {len(t.dims)} dims, at most {MAX_DIMS} allowed")
    n = 1
    for d in t.dims:
        n *= d
        if n > INT64_MAX:
            raise ModelLoadError(f"tensor {short(t.name)} has shape {list(t.dims)}, whose element count "
                                 "overflows: the file is corrupt")
    if t.dims and t.dims[0] % block:
        raise ModelLoadError(f"tensor {short(t.name)} ({qtype.name}) has rows of {t.dims[0]} elements, not a "
                             f"multiple of its block size {block}: the file is corrupt")
    return n // block * type_size


def check_tensor_table(tensors: Sequence[TensorInfo], data_offset: int, alignment: int, size: int) -> None:
    """ModelLoadError unless every tensor is well-formed (see `tensor_nbytes`), unique, aligned, inside
    the file, and no two tensors' data overlap."""
    seen: set[str] = set()
    spans: list[tuple[int, int, str]] = []
    for t in tensors:
        if t.name in seen:
            raise ModelLoadError(f"the tensor {short(t.name)} is listed twice: the file is corrupt")
        seen.add(t.name)
        nbytes = tensor_nbytes(t)
        if t.offset % alignment:
            raise ModelLoadError(f"tensor {short(t.name)} starts at offset {t.offset}, not a multiple of the "
                                 f"file's alignment {alignment}: the file is corrupt")
        start = data_offset + t.offset
        need(start + nbytes, size, f"the data of tensor {short(t.name)}")
        spans.append((start, start + nbytes, t.name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ModelLoadError(f"the data of tensors {short(a)} and {short(b)} overlap: the file is corrupt")
