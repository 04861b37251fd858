"""Reading GGUF files: metadata, model config and dequantized tensors (through the `gguf` package)."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

from hitenter.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from hitenter.config import ModelConfig


class FastGGUFReader(gguf.GGUFReader):
    """gguf.GGUFReader with array fields read in one go: the stock reader makes two numpy memmap views
    per array element (minutes of start-up for Gemma 3's 262k-token vocabulary on a busy machine); here a
    numeric array is one view and a string array costs one struct read per string. Same fields, same
    `contents()`; files in the other byte order take the stock path."""

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        vt = gguf.GGUFValueType
        if raw_type != vt.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, n, offs = vt(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:
            arr = self._get(offs, nptype, n)
            return 12 + int(arr.nbytes), [raw_itype, alen, arr], [2], [vt.ARRAY, itype]
        if itype != vt.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        buf = np.asarray(self.data)   # a plain ndarray: slicing it skips memmap's per-view bookkeeping
        mv = memoryview(buf)
        parts: list[Any] = [raw_itype, alen]
        idxs: list[int] = []
        for _ in range(n):
            (k,) = struct.unpack_from("<Q", mv, offs)
            parts += [buf[offs:offs + 8].view(np.uint64), buf[offs + 8:offs + 8 + k]]
            idxs.append(len(parts) - 1)
            offs += 8 + k
        return offs - orig_offs, parts, idxs, [vt.ARRAY, vt.STRING]


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
        return FastGGUFReader(str(p))
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
    ModelLoadError names it and the supported ones. A missing required key raises ModelLoadError naming
    the key. `tensor_names` (when given) decides tie_word_embeddings (True when there is no
    `output.weight`) and attention_bias (True when `blk.0.attn_q.bias` exists); without it, an untied
    head without biases is assumed.
    """
    from hitenter.models.families import family_for

    arch = meta.get("general.architecture")
    if arch is None:
        raise ModelLoadError("GGUF metadata is missing the required key 'general.architecture'")
    return family_for(str(arch)).config(meta, tensor_names)


DEQUANT_GROUP_BYTES = 1 << 20


def dequantize(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """gguf-py's dequantizer (the reference HF's GGUF loading uses) on a tensor's bytes, its rows taken about
    DEQUANT_GROUP_BYTES at a time from a plain ndarray: gguf.quants.dequantize takes 16 rows per call from
    memmap views, whose per-call and per-view bookkeeping costs more than the arithmetic (Qwen2.5-Coder-0.5B:
    ~14 s of a ~23 s fp32 load). Every value is computed per block by the same functions, so the result
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
