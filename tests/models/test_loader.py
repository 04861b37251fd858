"""GGUF loading: clear ModelLoadErrors, config from metadata, dequantization per tensor type."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hitenter.errors import ModelLoadError
from hitenter.models import gguf as gguf_module
from hitenter.models.gguf import (
    SUPPORTED_TENSOR_TYPES,
    load_tensors,
    model_config_from_metadata,
    open_gguf,
    read_gguf_metadata,
)
from hitenter.models.loader import load_model
from hitenter.testing.tiny_model import write_tiny_gguf

Q = gguf.GGMLQuantizationType


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="directory"):
        load_model(tmp_path)


def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(p)


@pytest.mark.parametrize("frac", [0.02, 0.5, 0.99])
def test_truncated(tmp_path: Path, tiny_llama_path: Path, frac: float) -> None:
    data = tiny_llama_path.read_bytes()
    p = tmp_path / "trunc.gguf"
    p.write_bytes(data[: int(len(data) * frac)])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        load_model(p)


def _minimal_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, Q | None]]) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_architecture(tmp_path: Path) -> None:
    p = _minimal_gguf(tmp_path / "falcon.gguf", "falcon", {"x.weight": (np.zeros((2, 32), np.float32), None)})
    with pytest.raises(ModelLoadError, match=r"unsupported model architecture 'falcon'; supported architectures: .*llama.*qwen3moe"):
        load_model(p)


def test_missing_metadata_key(tiny_llama_path: Path) -> None:
    meta = read_gguf_metadata(tiny_llama_path)
    del meta["llama.feed_forward_length"]
    with pytest.raises(ModelLoadError, match="llama.feed_forward_length"):
        model_config_from_metadata(meta)
    with pytest.raises(ModelLoadError, match="general.architecture"):
        model_config_from_metadata({})


def test_missing_tensor(tmp_path: Path, tiny_llama_path: Path) -> None:
    reader = open_gguf(tiny_llama_path)
    meta = read_gguf_metadata(reader)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for k, v in meta.items():
        if k == "general.architecture":
            continue
        if isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        else:
            w.add_float32(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="missing tensor"):
        load_model(tmp_path / "m.gguf")


def test_unsupported_quant_type(tmp_path: Path) -> None:
    raw = np.zeros((2, 66), np.uint8)  # two IQ2_XXS blocks (256 values each)
    p = _minimal_gguf(tmp_path / "iq2.gguf", "llama", {"blk.0.attn_q.weight": (raw, Q.IQ2_XXS)})
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_q\.weight.*unsupported GGML type IQ2_XXS"):
        load_tensors(open_gguf(p))


def test_config_from_tiny_metadata(tiny_llama_path: Path, tiny_qwen2_path: Path) -> None:
    r = open_gguf(tiny_llama_path)
    cfg = model_config_from_metadata(read_gguf_metadata(r), {t.name for t in r.tensors})
    assert (cfg.architecture, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == ("llama", 64, 2, 4, 2)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.context_length) == (16, 128, 256)
    assert cfg.tie_word_embeddings and not cfg.attention_bias
    r = open_gguf(tiny_qwen2_path)
    cfg = model_config_from_metadata(read_gguf_metadata(r), {t.name for t in r.tensors})
    assert cfg.architecture == "qwen2" and cfg.attention_bias and not cfg.tie_word_embeddings


def _random_kquant_blocks(qtype: Q, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Valid random K-quant bytes (gguf-py cannot quantize these): random nibbles, sane f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, 2, size), dtype=np.uint8)
    d = np.array([0.01], np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin, scales[12], qs[128]
        raw[..., 0:2] = d
        raw[..., 2:4] = np.array([0.005], np.float16).view(np.uint8)
    else:  # Q6_K: ql[128], qh[64], scales[16], d
        raw[..., 208:210] = d
    return raw.reshape(rows, 2 * size)


TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q6_K]


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_dequant_matches_gguf(tmp_path: Path, qtype: Q) -> None:
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((3, 512)).astype(np.float32)
    if qtype in (Q.Q4_K, Q.Q6_K):
        data, raw = _random_kquant_blocks(qtype, 3, rng), qtype
        expect = gguf.quants.dequantize(data, qtype)
    elif qtype == Q.F32:
        data, raw, expect = x, None, x
    elif qtype == Q.F16:
        data, raw, expect = x.astype(np.float16), None, x.astype(np.float16).astype(np.float32)
    else:
        data, raw = gguf.quants.quantize(x, qtype), qtype
        expect = gguf.quants.dequantize(data, qtype)
    p = _minimal_gguf(tmp_path / "t.gguf", "llama", {"w": (data, raw), "v": (x[0, :64].copy(), None)})
    reader = open_gguf(p)
    assert reader.tensors[0].tensor_type == qtype
    out = load_tensors(reader)
    assert out["w"].shape == (3, 512) and out["w"].dtype == torch.float32 and out["w"].is_contiguous()
    assert torch.equal(out["w"], torch.from_numpy(np.ascontiguousarray(expect, np.float32)))
    assert torch.equal(out["v"], torch.from_numpy(x[0, :64]))
    tol = {Q.F32: 0, Q.F16: 2e-3, Q.BF16: 2e-2, Q.Q8_0: 3e-2, Q.Q4_0: 0.5, Q.Q4_1: 0.5, Q.Q5_0: 0.25}
    if qtype in tol:
        assert float((out["w"] - torch.from_numpy(x)).abs().max()) <= tol[qtype]


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "F16"])
def test_quantized_tiny_model_loads(tmp_path: Path, quant: str) -> None:
    p = write_tiny_gguf(tmp_path / f"tiny-{quant}.gguf", quant=quant)
    types = {t.tensor_type.name for t in open_gguf(p).tensors}
    assert quant in types
    model, cfg = load_model(p)   # the default format: blocks with the native kernels, else dense fp32
    assert cfg.vocab_size == model.embed.num_embeddings


@pytest.mark.slow
def test_smollm2_config_and_load_time(smollm2_path: Path) -> None:
    import time

    t = time.perf_counter()
    model, cfg = load_model(smollm2_path)
    elapsed = time.perf_counter() - t
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta) == (64, 1536, 49152, 100000.0)
    assert cfg.tie_word_embeddings and not cfg.attention_bias and cfg.context_length == 8192
    assert elapsed < 90, f"loading SmolLM2 took {elapsed:.1f}s"


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TENSOR_TYPES - {Q.F32, Q.F16, Q.BF16}, key=lambda q: q.name),
                         ids=lambda q: q.name)
def test_grouped_dequantize_is_gguf_py_bit_for_bit(monkeypatch: pytest.MonkeyPatch, qtype: Q) -> None:
    """Our row grouping of gguf-py's dequantizer returns its exact bits (NaN patterns included, from random
    bytes), over several groups and a short last one."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = np.random.default_rng(int(qtype)).integers(0, 256, (7, 2, 3 * size), dtype=np.uint8)
    monkeypatch.setattr(gguf_module, "DEQUANT_GROUP_BYTES", 2 * data.shape[-1])   # 14 rows: 7 groups of 2
    with np.errstate(all="ignore"):   # random scales: inf and NaN on purpose
        got, want = gguf_module.dequantize(data, qtype), np.asarray(gguf.quants.dequantize(data, qtype))
    assert got.shape == want.shape == (7, 2, 3 * block) and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
