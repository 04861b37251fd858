"""Reading GGUF files: metadata, model config and dequantized tensors (through the `gguf` package)."""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

from hitenter.errors import ModelLoadError
from hitenter.models.gguf_checks import (
    MAX_DIMS,
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    MIN_KV_BYTES,
    MIN_TENSOR_INFO_BYTES,
    TensorInfo,
    check_count,
    check_tensor_table,
    decode_name,
    need,
    short,
)

if TYPE_CHECKING:
    import torch

    from hitenter.config import ModelConfig


_STRINGS = -1   # the data index FastGGUFReader gives a string array it has walked but not split


class StringArrayField(gguf.ReaderField):
    """A string array as FastGGUFReader reads it: parts [key length, key, type, element type, count, the
    strings' bytes (each a u64 length then its bytes), their start offsets]; `contents()` is gguf's
    (strict UTF-8), decoded in one pass when first asked for."""

    __slots__ = ()

    def contents(self, index_or_slice: int | slice = slice(None)) -> Any:
        region, starts = self.parts[-2].tobytes(), self.parts[-1]
        # the strings lie back to back: each ends where the next one's length field starts
        ends = [*starts[1:].tolist(), len(region)]
        if isinstance(index_or_slice, int):
            i = range(len(ends))[index_or_slice]
            return str(region[int(starts[i]) + 8:ends[i]], encoding="utf-8")
        return [str(region[s + 8:e], encoding="utf-8")
                for s, e in zip(starts.tolist()[index_or_slice], ends[index_or_slice], strict=True)]


class FastGGUFReader(gguf.GGUFReader):
    """gguf.GGUFReader with array fields read in one go, and every header value checked before use.

    Speed: the stock reader makes two numpy memmap views per array element (minutes of start-up for
    Gemma 3's 262k-token vocabulary on a busy machine); here a numeric array is one view and a string
    array costs one struct read per string. Same fields, same `contents()`; files in the other byte order
    take the stock path (with the same checks).

    Safety (hitenter/models/gguf_checks.py): every read is bounds-checked against the file's size; the
    key/value and tensor counts and every array length must fit the bytes left before anything is looped
    over; keys and tensor names are strict UTF-8, unique and short; value types are known and arrays are
    not nested; the tensor table is checked (types, dims, block multiples, overflow, alignment, bounds,
    overlaps) before any tensor is mapped. Every failure is a one-line ModelLoadError."""

    metadata: dict[str, Any] | None = None   # read_gguf_metadata's dict, kept after its first call on this reader

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        offset, count = int(offset), int(count)
        if offset < 0 or count < 0:
            raise ModelLoadError(f"a header field at byte {offset} has a negative position or size: the file is corrupt")
        need(offset + np.dtype(dtype).itemsize * count, len(self.data), f"a header field at byte {offset}")
        return super()._get(offset, dtype, count, override_order)

    def _build_fields(self, offs: int, count: int) -> int:
        vt = gguf.GGUFValueType
        check_count(int(count), MIN_KV_BYTES, len(self.data) - offs, "metadata key/values")
        for _ in range(int(count)):
            orig = offs
            klen = int(self._get(offs, np.uint64)[0])
            if klen > MAX_KEY_BYTES:
                raise ModelLoadError(f"a metadata key at byte {offs} claims {klen} bytes: the file is corrupt")
            kv_klen, kv_kdata = self._get_str(offs)
            key = decode_name(bytes(kv_kdata), "the metadata key")
            if key in self.fields:
                raise ModelLoadError(f"the metadata key {short(key)} appears twice: the file is corrupt")
            offs += 8 + klen
            raw_type = self._get(offs, np.uint32)
            offs += 4
            try:
                size, parts, idxs, types = self._get_field_parts(offs, int(raw_type[0]))
            except ModelLoadError as e:
                raise ModelLoadError(f"metadata key {short(key)}: {e}") from None
            if key == "general.alignment" and types != [vt.UINT32]:
                raise ModelLoadError(f"metadata key 'general.alignment' is a {types[0].name}, expected UINT32")
            kind = StringArrayField if idxs == [_STRINGS] else gguf.ReaderField
            self._push_field(kind(orig, key, [kv_klen, kv_kdata, raw_type, *parts], [i + 3 for i in idxs], types),
                             skip_sum=True)
            offs += size
        return offs

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        vt = gguf.GGUFValueType
        if int(raw_type) not in _VALUE_TYPES:
            raise ModelLoadError(f"unknown value type {int(raw_type)}: the file is corrupt")
        if raw_type != vt.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        n, offs = int(alen[0]), orig_offs + 12
        if int(raw_itype[0]) not in _VALUE_TYPES or raw_itype[0] == vt.ARRAY:
            raise ModelLoadError(f"an array of the unknown or nested element type {int(raw_itype[0])}: "
                                 "the file is corrupt")
        itype = vt(int(raw_itype[0]))
        nptype = self.gguf_scalar_to_np.get(itype)
        check_count(n, np.dtype(nptype).itemsize if nptype is not None else 8, len(self.data) - offs,
                    f"{itype.name} array entries")
        if self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        if nptype is not None:
            arr = self._get(offs, nptype, n)
            return 12 + int(arr.nbytes), [raw_itype, alen, arr], [2], [vt.ARRAY, itype]
        # the strings are only walked here (lengths checked); StringArrayField decodes them when asked
        buf = np.asarray(self.data)   # a plain ndarray: slicing it skips memmap's per-view bookkeeping
        mv, size, first = memoryview(buf), len(buf), offs
        starts = [0] * n
        unpack = struct.Struct("<Q").unpack_from
        for i in range(n):
            if offs + 8 > size:
                need(offs + 8, size, f"string {i} of the array")
            (k,) = unpack(mv, offs)
            if offs + 8 + k > size:
                need(offs + 8 + k, size, f"string {i} of the array ({k} bytes)")
            starts[i] = offs - first
            offs += 8 + k
        parts = [raw_itype, alen, buf[first:offs], np.array(starts, dtype=np.int64)]
        return offs - orig_offs, parts, [_STRINGS], [vt.ARRAY, vt.STRING]

    def _build_tensor_info(self, offs: int, count: int) -> tuple[int, list[Any]]:
        check_count(int(count), MIN_TENSOR_INFO_BYTES, len(self.data) - offs, "tensors")
        return super()._build_tensor_info(offs, int(count))

    def _get_tensor_info_field(self, orig_offs: int) -> Any:
        nlen = int(self._get(orig_offs, np.uint64)[0])
        if nlen > MAX_NAME_BYTES:
            raise ModelLoadError(f"a tensor name at byte {orig_offs} claims {nlen} bytes, more than "
                                 f"{MAX_NAME_BYTES}: the file is corrupt")
        name = decode_name(bytes(self._get(orig_offs + 8, np.uint8, nlen)), "the tensor name")
        n_dims = int(self._get(orig_offs + 8 + nlen, np.uint32)[0])
        if n_dims > MAX_DIMS:
            raise ModelLoadError(f"tensor {short(name)} has {n_dims} dims, at most {MAX_DIMS} allowed: "
                                 "the file is corrupt")
        return super()._get_tensor_info_field(orig_offs)

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        table = [TensorInfo(str(bytes(f.parts[1]), encoding="utf-8"), tuple(int(d) for d in f.parts[3]),
                            int(f.parts[4][0]), int(f.parts[5][0])) for f in fields]
        check_tensor_table(table, int(start_offs), int(self.alignment), len(self.data))
        super()._build_tensors(start_offs, fields)


_VALUE_TYPES = frozenset(int(t) for t in gguf.GGUFValueType)


def open_gguf(path: str | os.PathLike[str]) -> gguf.GGUFReader:
    """Open a GGUF file, turning every failure into a one-line ModelLoadError that names the file and the
    problem (the header's checks: FastGGUFReader)."""
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
        return FastGGUFReader(str(p))
    except ModelLoadError as e:
        raise ModelLoadError(one_line(f"{p}: {e}")) from None
    except Exception as e:  # the gguf package's own checks (version) and anything unforeseen
        raise ModelLoadError(one_line(f"{p} is truncated or corrupt: {type(e).__name__}: {e}")) from e


def one_line(message: str, limit: int = 500) -> str:
    """`message` on one line (a hostile file's text can hold newlines), cut to `limit` characters."""
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


LAZY_STRINGS_MIN = 4096   # read_gguf_metadata leaves string arrays this long undecoded until first read


class GGUFStrings(Sequence[str]):
    """A header string array (a vocabulary, its merges) as read_gguf_metadata gives it: its length known
    at once, its strings decoded (gguf's strict UTF-8, ModelLoadError when invalid) when first read and then
    kept. Equal to a list of the same strings; `list(x)` gives a plain list."""

    def __init__(self, field: StringArrayField, key: str) -> None:
        self._field, self._key, self._items = field, key, None
        self._n = len(field.parts[-1])

    def _all(self) -> list[str]:
        if self._items is None:
            try:
                self._items = self._field.contents()
            except Exception as e:
                raise ModelLoadError(one_line(f"GGUF metadata key {short(self._key)} is corrupt: "
                                              f"{type(e).__name__}: {e}")) from e
        return self._items

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFStrings):
            other = other._all()
        return isinstance(other, list | tuple) and self._n == len(other) and self._all() == list(other)

    __hash__ = None   # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<GGUFStrings {short(self._key)}: {self._n} strings>"


def _field_value(field: Any) -> Any:
    v = field.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


def read_gguf_metadata(reader_or_path: gguf.GGUFReader | str | os.PathLike[str]) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values (str, int, float, bool, list), but a
    string array of LAZY_STRINGS_MIN or more entries from a FastGGUFReader, which is a GGUFStrings (decoded
    when first read: a load whose tokenizer comes from its cache never decodes the vocabulary). A
    FastGGUFReader converts its fields once: later calls on the same reader return the same dict (the
    callers only read it), so the model and its tokenizer share one walk of the header."""
    reader = reader_or_path if isinstance(reader_or_path, gguf.GGUFReader) else open_gguf(reader_or_path)
    if isinstance(reader, FastGGUFReader) and reader.metadata is not None:
        return reader.metadata
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            lazy = isinstance(field, StringArrayField) and len(field.parts[-1]) >= LAZY_STRINGS_MIN
            out[key] = GGUFStrings(field, key) if lazy else _field_value(field)
        except Exception as e:
            raise ModelLoadError(one_line(f"GGUF metadata key {short(key)} is corrupt: {type(e).__name__}: {e}")) from e
    if isinstance(reader, FastGGUFReader):
        reader.metadata = out
    return out


SUPPORTED_TENSOR_TYPES: frozenset[gguf.GGMLQuantizationType] = frozenset({
    gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16,
    gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1,
    gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q5_1, gguf.GGMLQuantizationType.Q4_K,
    gguf.GGMLQuantizationType.Q5_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q2_K,
    gguf.GGMLQuantizationType.Q3_K, gguf.GGMLQuantizationType.IQ4_NL, gguf.GGMLQuantizationType.IQ4_XS,
    gguf.GGMLQuantizationType.MXFP4,
})


def model_config_from_metadata(meta: dict[str, Any], tensor_names: set[str] | None = None) -> ModelConfig:
    """Build a ModelConfig from GGUF metadata (see read_gguf_metadata), by the file's family
    (hitenter/models/families).

    Contract: architecture comes from `general.architecture` and must be a supported family, otherwise
    ModelLoadError names it and the supported ones. A missing required key, or one of the wrong type,
    raises ModelLoadError naming the key; so does a token list whose length is not the model's vocab_size
    (token ids must be valid rows of the embedding and entries of the vocabulary alike). `tensor_names`
    (when given) decides tie_word_embeddings (True when there is no `output.weight`) and attention_bias
    (True when `blk.0.attn_q.bias` exists); without it, an untied head without biases is assumed.
    """
    from hitenter.models.families import family_for

    arch = meta.get("general.architecture")
    if arch is None:
        raise ModelLoadError("GGUF metadata is missing the required key 'general.architecture'")
    if not isinstance(arch, str):
        raise ModelLoadError(f"GGUF metadata key 'general.architecture' must be a string, got {short(arch)}")
    cfg = family_for(arch).config(meta, tensor_names)
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list | GGUFStrings) and len(tokens) != cfg.vocab_size:
        raise ModelLoadError(f"the vocabulary has {len(tokens)} tokens but the model {cfg.vocab_size} "
                             f"({arch}.vocab_size): the file is corrupt")
    return cfg


DEQUANT_GROUP_BYTES = 1 << 20


def dequantize(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """gguf-py's dequantizer (the reference HF's GGUF loading uses) on a tensor's bytes, its rows taken about
    DEQUANT_GROUP_BYTES at a time from a plain ndarray: gguf.quants.dequantize takes 16 rows per call from
    memmap views, whose per-call and per-view bookkeeping costs more than the arithmetic (most of an fp32
    load's time). Every value is computed per block by the same functions, so the result
    is bit for bit gguf.quants.dequantize's."""
    traits = gguf.quants._type_traits.get(qtype)
    if traits is None or data.ndim < 2:
        return gguf.quants.dequantize(data, qtype)
    traits.init_grid()
    rows = np.asarray(data).reshape(-1, data.shape[-1])
    step = max(1, DEQUANT_GROUP_BYTES // rows.shape[1])
    out = np.concatenate([traits.dequantize_rows(rows[i:i + step]) for i in range(0, rows.shape[0], step)])
    return out.reshape(*data.shape[:-1], out.shape[-1])


def load_tensors(reader: gguf.GGUFReader, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """Dequantize the file's tensors (or only `names`) to contiguous fp32 torch tensors in torch order.

    GGUF stores dims in ggml `ne` order (fastest first); the reader's numpy arrays and the returned
    tensors use the reversed (torch / row-major) order, e.g. a [out, in] linear weight.
    Raises ModelLoadError for a tensor type outside SUPPORTED_TENSOR_TYPES (naming the type and tensor)
    and for tensor data that runs past the end of the file (truncated or corrupt).
    """
    import torch

    file_size = len(reader.data)
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if names is not None and t.name not in names:
            continue
        if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise ModelLoadError(
                f"tensor {t.name!r} uses the unsupported GGML type {t.tensor_type.name}; supported types: "
                + ", ".join(sorted(q.name for q in SUPPORTED_TENSOR_TYPES)))
        if t.data_offset + t.n_bytes > file_size or t.data.nbytes != t.n_bytes:
            raise ModelLoadError(f"tensor {t.name!r} lies beyond the end of the file: the file is truncated or corrupt")
        try:
            arr = dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise ModelLoadError(f"tensor {t.name!r} ({t.tensor_type.name}) could not be decoded: {e}") from e
        expected = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.asarray(arr, dtype=np.float32).reshape(expected)
        tensor = torch.from_numpy(np.array(arr, dtype=np.float32, copy=True, order="C"))
        if not math.isfinite(float(tensor.sum())):  # cheap NaN/inf probe (a full isfinite pass is slow)
            raise ModelLoadError(f"tensor {t.name!r} contains NaN or infinite values: the file is corrupt")
        out[t.name] = tensor
    return out
