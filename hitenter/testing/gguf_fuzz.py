"""Hostile variants of a well-formed GGUF, and the load every variant must survive (tests and
scripts/fuzz_gguf.py).

`layout(data)` walks a trusted GGUF header (one the tests wrote) into its structural fields: counts,
lengths, names, value types, values, the tensor table. `mutants(data, rng, n)` draws n variants, round-robin
over the kinds of damage, from the same seed always the same ones:
- truncation at a structural boundary (or one byte into a field);
- a count, length, dim count, dim, value type, element type, tensor type or tensor offset set to a
  boundary value (0, 1, 2^31-1, 2^32-1, 2^60, 2^64-1, its own value +-1 or doubled);
- a key, tensor name or string value with bad UTF-8 or a control character;
- a tensor's offset on another's (overlap), off its alignment, or past the end; a tensor's type swapped for
  another (wrong block size), a removed one or an unknown one;
- a metadata value replaced by one of another type (a string where an int is read, an int 2^40, a NaN,
  an array where a scalar is read, an empty array), a key dropped or listed twice;
- a chat template that is huge, loops for ever, recurses, or builds huge strings;
- random bytes flipped in the header, or in the tensor data.

`load_variant(path, dense)` does what loading a served model does with the file (the model in the file's
blocks or dense, the tokenizer, one chat rendering) and returns what happened: "loaded", "refused:
<one-line ModelLoadError>" or "template refused: <ValueError>"; anything else raised is a defect.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hitenter.errors import ModelLoadError

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_UINT32, _INT32, _FLOAT32, _BOOL, _UINT64 = 4, 5, 6, 7, 10
BOUNDARY_INTS = (0, 1, 2**31 - 1, 2**32 - 1, 2**60, 2**64 - 1)


@dataclass(frozen=True)
class Field:
    """One structural field of a header: `kind` (magic, version, count, length, name, vtype, itype, scalar,
    text, ndims, dim, ttype, toffset), where it lies, and for integers its width in bytes."""

    kind: str
    offset: int
    size: int


@dataclass(frozen=True)
class KV:
    """One key/value: its key, where the whole entry starts, and where its type+value starts and ends."""

    key: str
    start: int
    value_start: int
    end: int


@dataclass(frozen=True)
class Layout:
    fields: list[Field]
    kvs: list[KV]
    tensor_fields: list[list[Field]]    # per tensor: name length, name, ndims, dims..., type, offset
    header_end: int
    data_start: int
    alignment: int


def layout(data: bytes) -> Layout:
    """The structure of a well-formed little-endian GGUF (v2/v3) header."""
    fields = [Field("magic", 0, 4), Field("version", 4, 4), Field("count", 8, 8), Field("count", 16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    off, kvs, alignment = 24, [], 32

    def string(o: int, kind: str) -> int:
        (n,) = struct.unpack_from("<Q", data, o)
        fields.extend([Field("length", o, 8), Field(kind, o + 8, n)])
        return o + 8 + n

    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", data, off)
        key = data[off + 8:off + 8 + klen].decode()
        off = string(off, "name")
        (vt,) = struct.unpack_from("<I", data, off)
        fields.append(Field("vtype", off, 4))
        value_start, off = off, off + 4
        if vt == _STRING:
            off = string(off, "text")
        elif vt == _ARRAY:
            et, n = struct.unpack_from("<IQ", data, off)
            fields.extend([Field("itype", off, 4), Field("count", off + 4, 8)])
            off += 12
            for _ in range(n):
                if et == _STRING:
                    off = string(off, "text")
                else:
                    fields.append(Field("scalar", off, _SCALAR_SIZES[et]))
                    off += _SCALAR_SIZES[et]
        else:
            fields.append(Field("scalar", off, _SCALAR_SIZES[vt]))
            if key == "general.alignment":
                (alignment,) = struct.unpack_from("<I", data, off)
            off += _SCALAR_SIZES[vt]
        kvs.append(KV(key, start, value_start, off))
    tensor_fields = []
    for _ in range(n_tensors):
        first = len(fields)
        off = string(off, "name")
        (nd,) = struct.unpack_from("<I", data, off)
        fields.append(Field("ndims", off, 4))
        fields.extend(Field("dim", off + 4 + 8 * i, 8) for i in range(nd))
        off += 4 + 8 * nd
        fields.extend([Field("ttype", off, 4), Field("toffset", off + 4, 8)])
        off += 12
        tensor_fields.append(fields[first:])
    data_start = -(-off // alignment) * alignment
    return Layout(fields, kvs, tensor_fields, off, data_start, alignment)


def _put_int(data: bytes, f: Field, value: int) -> bytes:
    v = value % (1 << (8 * f.size))
    return data[:f.offset] + v.to_bytes(f.size, "little") + data[f.offset + f.size:]


def _enc_string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(value: object, vtype: int | None = None) -> bytes:
    """Type + value bytes of a metadata value: str, bool, int (UINT64 unless `vtype`), float (FLOAT32), or
    a list of one of those (an ARRAY)."""
    if isinstance(value, str | bytes):
        return struct.pack("<I", _STRING) + _enc_string(value)
    if isinstance(value, bool):
        return struct.pack("<IB", _BOOL, value)
    if isinstance(value, int):
        t = _UINT64 if vtype is None else vtype
        fmt = {_UINT32: "<I", _INT32: "<i", _UINT64: "<Q"}[t]
        return struct.pack("<I", t) + struct.pack(fmt, value)
    if isinstance(value, float):
        return struct.pack("<If", _FLOAT32, value)
    assert isinstance(value, list)
    items = [encode_value(v)[4:] for v in value]
    et = struct.unpack_from("<I", encode_value(value[0]))[0] if value else _INT32
    return struct.pack("<IIQ", _ARRAY, et, len(value)) + b"".join(items)


def _rebuild(data: bytes, lay: Layout, header: bytes, n_kv_delta: int = 0) -> bytes:
    """`header` (the file's header edited) re-padded to the alignment, the tensor data after it."""
    if n_kv_delta:
        (n_kv,) = struct.unpack_from("<Q", header, 16)
        header = header[:16] + struct.pack("<Q", n_kv + n_kv_delta) + header[24:]
    pad = -len(header) % lay.alignment
    return header + bytes(pad) + data[lay.data_start:]


def replace_value(data: bytes, lay: Layout, key: str, value_bytes: bytes) -> bytes:
    """The file with `key`'s type+value replaced by `value_bytes` (see encode_value)."""
    kv = next(k for k in lay.kvs if k.key == key)
    return _rebuild(data, lay, data[:kv.value_start] + value_bytes + data[kv.end:lay.header_end])


def drop_key(data: bytes, lay: Layout, key: str) -> bytes:
    kv = next(k for k in lay.kvs if k.key == key)
    return _rebuild(data, lay, data[:kv.start] + data[kv.end:lay.header_end], -1)


def duplicate_key(data: bytes, lay: Layout, key: str) -> bytes:
    kv = next(k for k in lay.kvs if k.key == key)
    last = lay.kvs[-1].end
    return _rebuild(data, lay, data[:last] + data[kv.start:kv.end] + data[last:lay.header_end], +1)


HOSTILE_TEMPLATES = (
    "{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{{ 'x' * 10**10 }}",
    "{{ 'x'.center(10**10) }}",
    "{{ 7 ** 999999 }}",
    "{{ ('%0999999999d' % 1) }}",
    "{{ messages.__class__.__mro__ }}",
    "{% for m in messages %}{{ raise_exception('no') }}{% endfor %}",
    "{{ 1 / 0 }}",
    "{% for i in range(60000) %}" + "{{ 'abcdefghij' * 1000 }}" + "{% endfor %}",
    "{% for i in range(60000) %}{{ messages|tojson }}{{ ''.join(['ab'] * 60000) }}{% endfor %}",
    "{{ ('{:>99999}' * 9999).format(*range(9999)) }}",
    "{{ ('%s' * 60000) % (('x' * 60000,) * 60000) }}",
    "{{ ('\n' * 60000)|indent(60000) }}",
    "{{ ('x' * 60000)|replace('', 'y' * 60000) }}",
    "{{ " + "(" * 2000 + "1" + ")" * 2000 + " }}",
    "{% if %}",
    "x" * (3 << 20),
)


def _categories(data: bytes, lay: Layout, rng: np.random.Generator) -> dict[str, Callable[[], tuple[str, bytes]]]:
    """Each kind of damage: a function that draws one variant of it (its label and bytes)."""
    ints = [f for f in lay.fields if f.kind in ("count", "length", "ndims", "dim", "vtype", "itype", "ttype",
                                                  "toffset", "version")]
    texts = [f for f in lay.fields if f.kind in ("name", "text") and f.size > 0]
    keys = [k.key for k in lay.kvs]
    tensors = lay.tensor_fields

    def pick(seq: list) -> object:
        return seq[int(rng.integers(len(seq)))]

    def truncate() -> tuple[str, bytes]:
        f = pick(lay.fields)
        cut = f.offset + (int(rng.integers(f.size)) if f.size > 1 and rng.random() < 0.3 else 0)
        if rng.random() < 0.1:
            cut = int(rng.integers(lay.data_start, len(data)))
        return f"truncate at byte {cut}", data[:cut]

    def boundary_int() -> tuple[str, bytes]:
        f = pick(ints)
        old = int.from_bytes(data[f.offset:f.offset + f.size], "little")
        v = int(pick([*BOUNDARY_INTS, old + 1, old - 1, old * 2]))
        return f"{f.kind} at byte {f.offset}: {old} -> {v}", _put_int(data, f, v)

    def bad_text() -> tuple[str, bytes]:
        f = pick(texts)
        at = f.offset + int(rng.integers(f.size))
        b = bytes([int(pick([0xFF, 0xC0, 0x80, 0xED, 0x00, 0x0A]))])
        return f"{f.kind} at byte {f.offset}: byte {at} -> {b!r}", data[:at] + b + data[at + 1:]

    def tensor_offset() -> tuple[str, bytes]:
        i = int(rng.integers(len(tensors)))
        f, other = tensors[i][-1], pick(tensors)[-1]
        theirs = int.from_bytes(data[other.offset:other.offset + 8], "little")
        old = int.from_bytes(data[f.offset:f.offset + 8], "little")
        v = int(pick([theirs, old + 1, old + lay.alignment, len(data), theirs + lay.alignment]))
        return f"tensor {i} offset {old} -> {v}", _put_int(data, f, v)

    def tensor_type() -> tuple[str, bytes]:
        i = int(rng.integers(len(tensors)))
        f = tensors[i][-2]
        v = int(pick([0, 1, 2, 4, 5, 6, 8, 10, 12, 14, 16, 20, 23, 24, 26, 28, 30, 39, 40, 99, 2**32 - 1]))
        return f"tensor {i} type -> {v}", _put_int(data, f, v)

    def wrong_type() -> tuple[str, bytes]:
        key = str(pick(keys))
        value = pick(["abc", -1, 2**40, float("nan"), float("inf"), True, [1, 2], ["a", "b"], [], [2**40] * 3])
        vtype = _INT32 if value == -1 else None
        return f"{key} = {value!r}", replace_value(data, lay, key, encode_value(value, vtype))

    def key_set() -> tuple[str, bytes]:
        key = str(pick(keys))
        if rng.random() < 0.5:
            return f"drop {key}", drop_key(data, lay, key)
        return f"duplicate {key}", duplicate_key(data, lay, key)

    def template() -> tuple[str, bytes]:
        t = str(pick(list(HOSTILE_TEMPLATES)))
        return f"chat template {t[:40]!r}", replace_value(data, lay, "tokenizer.chat_template", encode_value(t))

    def flip(lo: int, hi: int, label: str) -> Callable[[], tuple[str, bytes]]:
        def draw() -> tuple[str, bytes]:
            buf = bytearray(data)
            at = rng.integers(lo, hi, size=int(rng.integers(1, 9)))
            for a in at:
                buf[int(a)] ^= int(rng.integers(1, 256))
            return f"{label} bytes {sorted(int(a) for a in at)} flipped", bytes(buf)
        return draw

    return {"truncate": truncate, "boundary_int": boundary_int, "bad_text": bad_text,
            "tensor_offset": tensor_offset, "tensor_type": tensor_type, "wrong_type": wrong_type,
            "key_set": key_set, "template": template, "header_flip": flip(0, lay.header_end, "header"),
            "data_flip": flip(lay.data_start, len(data), "data")}


def mutants(data: bytes, rng: np.random.Generator, n: int) -> Iterator[tuple[str, str, bytes]]:
    """n variants of `data` as (kind, label, bytes), round-robin over the kinds of damage."""
    lay = layout(data)
    kinds = list(_categories(data, lay, rng).items())
    for i in range(n):
        kind, draw = kinds[i % len(kinds)]
        label, variant = draw()
        yield kind, label, variant


MESSAGES = [{"role": "user", "content": "Hello world"}]


def load_variant(path: str | Path, dense: bool = False) -> str:
    """Load `path` as serving does (model, tokenizer, one chat prompt); 'loaded', 'refused: <message>'
    (a ModelLoadError, one line) or 'template refused: <message>' (a ValueError from the template).
    Anything else raised is a defect and propagates."""
    from hitenter.models.loader import load_model
    from hitenter.tokenizer.bpe import Tokenizer

    try:
        load_model(path, dtype="float32" if dense else "auto")
        tok = Tokenizer.from_gguf(path)
    except ModelLoadError as e:
        if "\n" in str(e):
            raise AssertionError(f"a load error of more than one line: {e!r}") from e
        return f"refused: {e}"
    try:
        tok.apply_chat_template(MESSAGES)
    except ValueError as e:
        return f"template refused: {e}"
    return "loaded"
