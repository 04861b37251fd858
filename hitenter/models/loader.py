"""load_model(path) -> (model, config): GGUF file -> LlamaModel with fp32 (or `dtype`) weights.

`quantization="int8" | "int4"` keeps the projection weights (and embedding / head) quantized in memory
instead (hitenter/quant: converted from the GGUF's blocks at load); the resident weight bytes are logged.

Every failure (missing/not GGUF/truncated file, unsupported architecture or tensor type, missing or
misshapen tensor) raises ModelLoadError with a message naming the problem.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from hitenter.config import ModelConfig
from hitenter.errors import ModelLoadError
from hitenter.models import gemma3
from hitenter.models.gguf import load_tensors, model_config_from_metadata, open_gguf, read_gguf_metadata
from hitenter.models.llama import LlamaModel, TensorParallel, unpermute_qk
from hitenter.quant.weights import QUANTIZATIONS, quantize_weights

log = logging.getLogger("hitenter.loader")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Torch-order shape of every tensor the model needs."""
    if cfg.architecture == "gemma3":
        return gemma3.expected_shapes(cfg)
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (cfg.vocab_size, h),
        "output_norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        shapes.update({
            p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
            p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
            p + "attn_output.weight": (h, q),
            p + "ffn_gate.weight": (cfg.intermediate_size, h), p + "ffn_up.weight": (cfg.intermediate_size, h),
            p + "ffn_down.weight": (h, cfg.intermediate_size),
        })
        if cfg.attention_bias:
            shapes.update({p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)})
    return shapes


def load_model(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32,
               tp: TensorParallel | None = None, quantization: str = "none") -> tuple[Any, ModelConfig]:
    """Load a llama / qwen2 GGUF into an eval-mode LlamaModel (gemma3: gemma3.Gemma3Model). Raises
    ModelLoadError on any problem.

    With `tp` (a tensor-parallel group, see hitenter/distributed) the model holds only this rank's shard.
    `quantization`: "none" (weights in `dtype`), "int8" or "int4" (see hitenter/quant)."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ModelLoadError(f"unsupported dtype {dtype}; use torch.float32, torch.bfloat16 or torch.float16")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization: must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    if quantization != "none" and tp is not None:
        raise ValueError("quantization: quantized weights with tensor parallelism are not supported yet")
    cfg, weights = load_weights(path, quantization)
    if cfg.architecture == "gemma3" and tp is not None:
        raise ModelLoadError("tensor parallelism is not supported for gemma3 models yet")
    model: LlamaModel | gemma3.Gemma3Model = (gemma3.Gemma3Model(cfg, weights, dtype) if cfg.architecture == "gemma3"
                                              else LlamaModel(cfg, weights, dtype, tp))
    model.eval()
    log.info("loaded %s: %s weights, %.1f MB resident", os.fspath(path),
             dtype if quantization == "none" else quantization, model.weight_bytes() / 1e6)
    return model, cfg


def _unpermute(w: Any, n_head: int) -> Any:
    if isinstance(w, torch.Tensor):
        return unpermute_qk(w, n_head)
    return w.index_rows(unpermute_qk(torch.arange(w.shape[0]), n_head))   # a quantized layout: same row order


def load_weights(path: str | os.PathLike[str], quantization: str = "none") -> tuple[ModelConfig, dict[str, Any]]:
    """The config and the full dequantized fp32 tensors (llama Q/K un-permuted), checked against the config.

    With quantization "int8" / "int4" the projection weights and embedding / head are quantized layouts
    (hitenter/quant/weights.py) instead of fp32 tensors."""
    reader = open_gguf(path)
    meta = read_gguf_metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = model_config_from_metadata(meta, names)
    shapes = expected_shapes(cfg)
    missing = sorted(set(shapes) - names)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(f"{path}: missing tensor(s) {', '.join(missing[:5])}{more}")
    weights = load_tensors(reader, set(shapes))
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise ModelLoadError(f"{path}: tensor {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")
    out: dict[str, Any] = quantize_weights(reader, dict(weights), quantization)
    if cfg.architecture == "llama":
        for i in range(cfg.num_layers):
            out[f"blk.{i}.attn_q.weight"] = _unpermute(out[f"blk.{i}.attn_q.weight"], cfg.num_heads)
            out[f"blk.{i}.attn_k.weight"] = _unpermute(out[f"blk.{i}.attn_k.weight"], cfg.num_kv_heads)
    return cfg, out
