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


SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "gemma3")

SUPPORTED_TENSOR_TYPES: frozenset[gguf.GGMLQuantizationType] = frozenset({
    gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16,
    gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1,
    gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q5_1, gguf.GGMLQuantizationType.Q4_K,
    gguf.GGMLQuantizationType.Q5_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q2_K,
    gguf.GGMLQuantizationType.Q3_K, gguf.GGMLQuantizationType.IQ4_NL, gguf.GGMLQuantizationType.IQ4_XS,
    gguf.GGMLQuantizationType.MXFP4,
})


def _meta_get(meta: dict[str, Any], key: str, default: Any = None, required: bool = True) -> Any:
    if key in meta:
        return meta[key]
    if required:
        raise ModelLoadError(f"GGUF metadata is missing the required key {key!r}")
    return default


def model_config_from_metadata(meta: dict[str, Any], tensor_names: set[str] | None = None) -> ModelConfig:
    """Build a ModelConfig from GGUF metadata (see read_gguf_metadata).

    Contract: architecture comes from `general.architecture` and must be one of SUPPORTED_ARCHITECTURES,
    otherwise ModelLoadError names it and the supported ones. A missing required key raises
    ModelLoadError naming the key. `tensor_names` (when given) decides tie_word_embeddings (True when
    there is no `output.weight`) and attention_bias (True when `blk.0.attn_q.bias` exists); without
    it, llama is assumed tied without biases and qwen2 untied with Q/K/V biases.
    """
    from hitenter.config import ModelConfig

    arch = _meta_get(meta, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported model architecture {arch!r}; supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}")
    hidden = int(_meta_get(meta, f"{arch}.embedding_length"))
    heads = int(_meta_get(meta, f"{arch}.attention.head_count"))
    kv_heads = int(_meta_get(meta, f"{arch}.attention.head_count_kv", heads, required=False))
    head_dim = int(_meta_get(meta, f"{arch}.attention.key_length", 0, required=False)) or hidden // max(heads, 1)
    vocab = _meta_get(meta, f"{arch}.vocab_size", None, required=False)
    if vocab is None:
        vocab = len(_meta_get(meta, "tokenizer.ggml.tokens"))
    if tensor_names is not None:
        tied = "output.weight" not in tensor_names
        bias = "blk.0.attn_q.bias" in tensor_names
    else:
        tied, bias = arch in ("llama", "gemma3"), arch == "qwen2"
    try:
        return ModelConfig(
            architecture=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(_meta_get(meta, f"{arch}.feed_forward_length")),
            num_layers=int(_meta_get(meta, f"{arch}.block_count")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=float(_meta_get(meta, f"{arch}.rope.freq_base", 10000.0, required=False)),
            rms_norm_eps=float(_meta_get(meta, f"{arch}.attention.layer_norm_rms_epsilon")),
            context_length=int(_meta_get(meta, f"{arch}.context_length")),
            tie_word_embeddings=tied,
            attention_bias=bias,
            name=str(meta.get("general.name", "")),
            **_gemma3_fields(meta, arch, head_dim),
        )
    except ValueError as e:
        raise ModelLoadError(f"GGUF metadata describes an invalid model: {e}") from e


# llama.cpp (llama-model.cpp, LLM_ARCH_GEMMA3) hard-codes these when the GGUF does not say otherwise
GEMMA3_SWA_PATTERN = 6            # 5 local layers, then 1 global
GEMMA3_LOCAL_ROPE_THETA = 10000.0


def _gemma3_fields(meta: dict[str, Any], arch: str, head_dim: int) -> dict[str, Any]:
    """Gemma 3's extra ModelConfig fields (none for other architectures). llama.cpp's conventions: the
    attention scale is 1/sqrt(head_dim) (query_pre_attn_scalar == head_dim for all but the 27B model,
    whose converter writes no key for it either), the local layers use RoPE base 10k."""
    if arch != "gemma3":
        return {}
    scaling = meta.get(f"{arch}.rope.scaling.type")
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0)) if scaling in (None, "linear") else 1.0
    if scaling not in (None, "none", "linear"):
        raise ModelLoadError(f"gemma3: RoPE scaling type {scaling!r} is not supported (only linear)")
    return {
        "sliding_window": int(_meta_get(meta, f"{arch}.attention.sliding_window")),
        "sliding_window_pattern": int(meta.get(f"{arch}.attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)),
        "rope_local_theta": GEMMA3_LOCAL_ROPE_THETA,
        "rope_scaling_factor": factor or 1.0,
        "query_pre_attn_scalar": float(meta.get(f"{arch}.attention.query_pre_attn_scalar", head_dim)),
        "final_logit_softcap": float(meta.get(f"{arch}.final_logit_softcapping", 0.0)),
    }


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
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise ModelLoadError(f"tensor {t.name!r} ({t.tensor_type.name}) could not be decoded: {e}") from e
        expected = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.asarray(arr, dtype=np.float32).reshape(expected)
        tensor = torch.from_numpy(np.array(arr, dtype=np.float32, copy=True, order="C"))
        if not math.isfinite(float(tensor.sum())):  # cheap NaN/inf probe (a full isfinite pass is slow)
            raise ModelLoadError(f"tensor {t.name!r} contains NaN or infinite values: the file is corrupt")
        out[t.name] = tensor
    return out
