"""load_model(path) -> (model, config): GGUF file -> decoder.CausalLM of its family (encoder.EncoderModel for a
bidirectional one), in one of the weight formats, with the file's pooling (models/pooling.py) as `model.pooler`.

The format follows `dtype` / `quantization` (hitenter/models/formats.py): by default ("auto") the
GGUF's own blocks (hitenter/kernels BlockWeight, run by qmatmul with fp32 activations; dense fp32 where
the native kernels are absent); dtype "float32" / "bfloat16" dequantizes every tensor (the HF-exact
reference / bf16); `quantization="int8" | "int4"` keeps torch's quantized layouts (hitenter/quant).
The resident weight bytes are logged.

The file's family (hitenter/models/families, by general.architecture) reads its config, says which
tensors the file must hold, and prepares them under the decoder's names (Q/K un-permuted, fused tensors
split). Every failure (missing/not GGUF/truncated file, unsupported architecture or tensor type, missing
or misshapen tensor) raises ModelLoadError with a message naming the problem.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.kernels import BLOCK_TYPES, BlockWeight, block_weight_from_gguf
from hitenter.kernels.arena import drop_mapped_pages
from hitenter.models.block_linear import own_block_bytes
from hitenter.models.decoder import CausalLM
from hitenter.models.encoder import EncoderModel
from hitenter.models.families import family_for
from hitenter.models.formats import resolve_format
from hitenter.models.gemma4 import Gemma4LM
from hitenter.models.gguf import load_tensors, model_config_from_metadata, open_gguf, read_gguf_metadata
from hitenter.models.hybrid import HybridLM
from hitenter.models.mapped_rows import mapped_table
from hitenter.models.moe import ExpertWeight, expert_weights
from hitenter.models.pooling import Pooler, head_shapes
from hitenter.models.shard import TensorParallel
from hitenter.models.weight_cache import WeightCache
from hitenter.quant.weights import quantize_weights

log = logging.getLogger("hitenter.loader")


def expected_shapes(cfg: ModelConfig, names: set[str] | frozenset[str] = frozenset()) -> dict[str, tuple[int, ...]]:
    """Torch-order shape of every tensor a file of this config must hold (`names`: the file's own, for
    optional tensors such as rope_freqs)."""
    return family_for(cfg.architecture).file_shapes(cfg, set(names))


def load_model(path: str | os.PathLike[str], dtype: str | torch.dtype = "auto",
               tp: TensorParallel | None = None, quantization: str | None = None,
               batch_invariant: bool = True, max_model_len: int | None = None,
               reader: Any = None) -> tuple[Any, ModelConfig]:
    """Load a GGUF of any supported family into an eval-mode CausalLM. Raises ModelLoadError on any problem.

    `dtype`: "auto" (the file's blocks, fp32 activations), "float32", "bfloat16" (or a torch dtype):
    dense weights. `quantization`: None / "none", "gguf" (the file's blocks, explicitly), "int8", "int4".
    Bad combinations raise ValueError (see hitenter/models/formats.py). With `tp` (a tensor-parallel
    group, see hitenter/distributed) the model holds only this rank's shard. `max_model_len`: the
    context the engine will serve (LongRoPE files pick their factors by it; default the model's own).
    `reader`: the file at `path` already open (open_gguf: its header parsed once), else opened here."""
    act_dtype, fmt = resolve_format(dtype, quantization, tp is not None)
    reader = reader if reader is not None else open_gguf(path)
    cache = WeightCache.for_gguf(path) if fmt == "gguf" and tp is None else None
    if cache is not None and cache.hit:   # built over placeholders, the weights mapped from the cache file
        try:
            return _finish(path, reader, *_build(reader, act_dtype, fmt, tp, batch_invariant, max_model_len,
                                                  cache), act_dtype, fmt, cache)
        except ModelLoadError:
            raise
        except Exception as e:   # a build that reads weight bytes, or a cache that does not match
            log.info("weight cache %s not used (%s: %s): building from the file", cache.path, type(e).__name__, e)
            cache.hit = False
    return _finish(path, reader, *_build(reader, act_dtype, fmt, tp, batch_invariant, max_model_len),
                   act_dtype, fmt, cache)


def _build(reader: Any, act_dtype: torch.dtype, fmt: str, tp: TensorParallel | None, batch_invariant: bool,
           max_model_len: int | None, cache: WeightCache | None = None) -> tuple[Any, ModelConfig]:
    """The model of `reader`'s file in format `fmt`, its block weights still where the build left them;
    with a cache hit every block weight read through `block_weights` is a meta placeholder."""
    cfg, weights = load_weights_from(reader, "none" if fmt == "dense" else fmt,
                                     cache is not None and cache.hit)
    if tp is not None:
        check_shardable(cfg)
    if not cfg.causal:   # an encoder (bert, nomic-bert, gemma-embedding): bidirectional, pooled
        if tp is not None:
            raise ModelLoadError(f"tensor parallelism is not supported for {cfg.architecture} encoders")
        model: Any = EncoderModel(cfg, weights, act_dtype, fmt)
    elif cfg.layer_types:   # a hybrid model: attention and recurrent layers (models/hybrid.py)
        model = HybridLM(cfg, weights, act_dtype, batch_invariant, fmt, max_model_len)
    elif cfg.architecture == "gemma4":   # per-layer shapes, shared KV, per-layer inputs (models/gemma4.py)
        if tp is not None:
            raise ModelLoadError("tensor parallelism is not supported for gemma4 models")
        model = Gemma4LM(cfg, weights, act_dtype, batch_invariant, fmt, max_model_len)
    else:
        model = CausalLM(cfg, weights, act_dtype, tp, batch_invariant, fmt, max_model_len)
    if cfg.causal:   # a decoder's embeddings: the file's pooling and heads (Qwen3-Embedding, -Reranker)
        model.pooler = Pooler(cfg, weights)
    return model, cfg


def _finish(path: str | os.PathLike[str], reader: Any, model: Any, cfg: ModelConfig, act_dtype: torch.dtype,
            fmt: str, cache: WeightCache | None) -> tuple[Any, ModelConfig]:
    """The built model with its block weights in their arena (own_block_bytes), the map released."""
    own_block_bytes(model, cache)
    # the build read the whole map (copies into the arena); what still views it (an untied embedding
    # table) faults back in only the rows it looks up
    drop_mapped_pages(reader.data.ctypes.data, reader.data.nbytes)
    model.eval()
    log.info("loaded %s: %s weights, %.1f MB resident", os.fspath(path),
             act_dtype if fmt == "dense" else fmt, model.weight_bytes() / 1e6)
    return model, cfg


def check_shardable(cfg: ModelConfig) -> None:
    """ModelLoadError unless tensor parallelism can split this config's layers (heads split across ranks:
    a norm over the whole Q/K would need the other ranks' heads; experts are replicated, so they shard)."""
    why = "its QK-norm spans all heads" if cfg.qk_norm == "full" else ""
    if cfg.layer_types:
        why = "it has recurrent layers (a hybrid model's state is not sharded yet)"
    if why:
        raise ModelLoadError(f"tensor parallelism is not supported for {cfg.architecture} models: {why}")


def load_weights(path: str | os.PathLike[str], quantization: str = "none") -> tuple[ModelConfig, dict[str, Any]]:
    """The config and the full tensors (under the decoder's names, Q/K un-permuted), checked against the config.

    quantization "none": every tensor dequantized to fp32. "gguf": block-type matrices as BlockWeight
    (one copy of the file's bytes; see `block_weights`), the rest fp32. "int8" / "int4": the projection
    weights and embedding / head in quantized layouts (hitenter/quant/weights.py)."""
    return load_weights_from(open_gguf(path), quantization)


def load_weights_from(reader: Any, quantization: str = "none",
                      placeholders: bool = False) -> tuple[ModelConfig, dict[str, Any]]:
    """`load_weights` on an open GGUF reader (its map stays the caller's to release). `placeholders`
    (quantization "gguf" only): block matrices as meta placeholders, see `block_weights`."""
    path = reader.data.filename
    meta = read_gguf_metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = model_config_from_metadata(meta, names)
    shapes = {**expected_shapes(cfg, names), **head_shapes(cfg, names)}
    missing = sorted(set(shapes) - names)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(f"{path}: missing tensor(s) {', '.join(missing[:5])}{more}")
    mapped = {t.name: mapped_table(t) for t in reader.tensors    # row tables: left on the map, any format
              if t.name in shapes and t.name in family_for(cfg.architecture).mapped_tables}
    rest = set(shapes) - set(mapped)
    weights = {**(block_weights(reader, rest, placeholders) if quantization == "gguf" else load_tensors(reader, rest)),
               **mapped}
    for name, shape in shapes.items():   # -1: any size (a classifier's outputs, a dense head's width)
        got = _shape(weights[name])
        if len(got) != len(shape) or any(s not in (-1, g) for s, g in zip(shape, got, strict=True)):
            raise ModelLoadError(f"{path}: tensor {name!r} has shape {got}, expected {shape}")
    out: dict[str, Any] = dict(weights)
    if quantization in ("int8", "int4"):
        out = quantize_weights(reader, out, quantization)
    return cfg, family_for(cfg.architecture).prepare(out, cfg)


def _shape(w: Any) -> tuple[int, ...]:
    if isinstance(w, ExpertWeight):
        return (w.n_expert, w.out_features, w.in_features)
    return tuple(w.shape)


def block_weights(reader: Any, names: set[str], placeholders: bool = False) -> dict[str, Any]:
    """`names`' tensors: matrices of a native block type as BlockWeight, everything else dequantized fp32.

    The BlockWeights view the reader's memory map; `own_block_bytes` copies what the built model still
    views (fused and un-permuted weights were copied while building), so each byte is copied once and
    the map is released with the reader. With `placeholders` (a weight cache hit) each such matrix is a
    BlockWeight over a meta tensor of its shape (the build then copies nothing) whose `source` is its
    view of the map. Raises ModelLoadError for data past the end of the file."""
    out: dict[str, Any] = {}
    file_size = len(reader.data)
    for t in reader.tensors:
        if t.name in names and len(t.shape) == 3:   # a mixture's experts (models/moe.py): blocks or dense
            out[t.name] = expert_weights(reader, t.name)
            continue
        if t.name not in names or int(t.tensor_type) not in BLOCK_TYPES or len(t.shape) != 2:
            continue
        if t.data_offset + t.n_bytes > file_size or t.data.nbytes != t.n_bytes:
            raise ModelLoadError(f"tensor {t.name!r} lies beyond the end of the file: the file is truncated or corrupt")
        with warnings.catch_warnings():   # a read-only map viewed by torch: never written, copied after the build
            warnings.simplefilter("ignore", UserWarning)
            out[t.name] = block_weight_from_gguf(t)
        if placeholders:
            real = out[t.name]
            out[t.name] = BlockWeight(torch.empty(real.data.shape, dtype=torch.uint8, device="meta"),
                                      real.qtype, real.shape)
            out[t.name].source = real   # what a build that reads the weight's values reads
    out.update(load_tensors(reader, names - set(out)))
    return out
