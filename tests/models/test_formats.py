"""The GGUF's own blocks as the weight format (hitenter/models/formats.py, block_linear.py).

References are independent of the block path: the dense fp32 model (every tensor dequantized by
gguf-py's reference dequantizer, the HF-exact path of tests/models/test_decoder.py) and gguf-py's dequantizer
itself. Without the native kernels, HITENTER_GGUF_REFERENCE=1 keeps the blocks and runs the torch
reference qmatmul (the fixture `blocks`); with them, these tests exercise the native kernels.

Tolerances (logits of the block model vs the dense fp32 model): mean |diff| <= 5% of the dense
logits' std, max |diff| <= 10% of their largest |value|, argmax equal at >= 90% of positions. The
native kernels round activations to int8 per block, as llama.cpp does (about 0.5% relative error per
product, tests/kernels/test_qmatmul.py); measured on 128 tokens of SmolLM2: mean 0.15 (2.4% of std 6.0), max
1.5 (4.4% of 33.9), argmax 97.7%. The reference qmatmul is the same fp32 math as the dense model
(max |diff| ~1e-4). Perplexity on the first 512 tokens of the bundled English text (one window): within 1%
(block / dense - 1 at 512 vs 1,024 tokens: SmolLM2 +0.37% / +0.35%, Qwen2.5-Coder-0.5B +0.24% / +0.05%).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hitenter import LLM, SamplingParams, kernels
from hitenter.models import formats
from hitenter.models.block_linear import BlockEmbedding, BlockLinear
from hitenter.models.gguf import open_gguf
from hitenter.models.linear import Linear
from hitenter.models.loader import load_model
from hitenter.models.registry import model_path
from hitenter.testing.perplexity import _Seq, english_text, perplexity
from hitenter.testing.tiny_model import write_tiny_gguf

# Q4_K_M's mix (K-quants, attn_v / ffn_down in Q6_K) and a Qwen2.5-0.5B-like mix of the 32-wide types:
# together every native block type
K_MIX = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q5_K",
         "ffn_up": "Q5_K", "ffn_down": "Q6_K", "token_embd": "Q6_K"}
SMALL_MIX = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_0", "ffn_gate": "Q5_1",
             "ffn_up": "Q5_1", "ffn_down": "Q4_1", "token_embd": "Q5_0", "output": "Q8_0"}
PPL_TOKENS = 512


@pytest.fixture
def blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep GGUF blocks even where the native kernels are absent (the reference qmatmul then runs them)."""
    monkeypatch.setenv("HITENTER_GGUF_REFERENCE", "1")


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("native")
    return {"q8_llama": write_tiny_gguf(d / "q8.gguf", arch="llama", quant="Q8_0", seed=4),
            "kmix_llama": write_tiny_gguf(d / "kmix.gguf", arch="llama", quant=K_MIX, hidden=256, ffn=512, seed=5),
            "small_qwen2": write_tiny_gguf(d / "small.gguf", arch="qwen2", quant=SMALL_MIX, seed=6)}


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return _Seq(model, len(ids)).step(ids)


def _assert_close(block: torch.Tensor, dense: torch.Tensor) -> None:
    """The tolerances of the module doc."""
    diff = (block - dense).abs()
    assert float(diff.mean()) <= 0.05 * float(dense.std()), (float(diff.mean()), float(dense.std()))
    assert float(diff.max()) <= 0.10 * float(dense.abs().max()), (float(diff.max()), float(dense.abs().max()))
    assert float((block.argmax(-1) == dense.argmax(-1)).float().mean()) >= 0.9


def _file_tensor_bytes(path: Path) -> int:
    return sum(int(t.n_bytes) for t in open_gguf(path).tensors)


# ---------------------------------------------------------------- options -> format


def test_resolve_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "native_available", lambda: True)
    f32, bf16 = torch.float32, torch.bfloat16
    assert formats.resolve_format() == (f32, "gguf")
    assert formats.resolve_format("auto", "none") == (f32, "gguf")
    assert formats.resolve_format("float32") == (f32, "dense")
    assert formats.resolve_format("bfloat16") == (bf16, "dense")
    assert formats.resolve_format(torch.bfloat16) == (bf16, "dense")
    assert formats.resolve_format("auto", "gguf") == formats.resolve_format("float32", "gguf") == (f32, "gguf")
    assert formats.resolve_format("auto", "int4") == (f32, "int4")
    assert formats.resolve_format("bfloat16", "int8") == (bf16, "int8")
    assert formats.resolve_format("auto", None, tensor_parallel=True) == (f32, "gguf")    # block shards
    assert formats.resolve_format("auto", "gguf", tensor_parallel=True) == (f32, "gguf")
    with pytest.raises(ValueError, match="fp32 activations"):
        formats.resolve_format("bfloat16", "gguf")
    with pytest.raises(ValueError, match="quantization"):
        formats.resolve_format("auto", "q4")
    with pytest.raises(ValueError, match="dtype"):
        formats.resolve_format("float64")


def test_without_native_kernels_the_blocks_are_dequantized_once_warned(
        tiny_paths: dict[str, Path], reload_kernels: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    reload_kernels.setenv("CC", os.path.join(os.sep, "nonexistent", "cc"))   # the quantized-matmul build fails
    reload_kernels.delenv("HITENTER_GGUF_REFERENCE", raising=False)
    with caplog.at_level(logging.WARNING):
        m1, _ = load_model(tiny_paths["q8_llama"])
        m2, _ = load_model(tiny_paths["q8_llama"], quantization="gguf")
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "matmul" in r.getMessage()]
    assert len(said) == 1 and "dense fp32" in said[0], said     # one warning, saying what runs instead
    for m in (m1, m2):
        assert m.weight_format == "dense" and m.dtype == torch.float32
        assert not any(isinstance(x, (BlockLinear, BlockEmbedding)) for x in m.modules())
    ref, _ = load_model(tiny_paths["q8_llama"], dtype="float32")
    ids = list(range(3, 40))
    assert torch.equal(_logits(m1, ids), _logits(ref, ids))   # exactly the dtype="float32" model


# ---------------------------------------------------------------- tiny models in blocks


@pytest.mark.parametrize("name", ["q8_llama", "kmix_llama", "small_qwen2"])
def test_tiny_block_model_matches_dense_fp32(blocks: None, tiny_paths: dict[str, Path], name: str) -> None:
    path = tiny_paths[name]
    model, cfg = load_model(path)
    assert model.weight_format == "gguf"
    assert not any(isinstance(x, Linear) for x in model.modules())   # every matrix is a block type here
    ref, _ = load_model(path, dtype="float32")
    ids = torch.randint(3, cfg.vocab_size, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    a, b = _logits(model, ids), _logits(ref, ids)
    assert b.std() > 0.1
    _assert_close(a, b)
    assert model.weight_bytes() <= 1.05 * _file_tensor_bytes(path)


def test_fused_projections_by_block_type(blocks: None, tiny_paths: dict[str, Path]) -> None:
    """Q/K/V in one qmatmul when they share a type; Q4_K Q+K then Q6_K V when they do not (Q4_K_M)."""
    layer = load_model(tiny_paths["q8_llama"])[0].layers[0]
    assert [p.type_name for p in layer.qkv.parts] == ["Q8_0"] and len(layer.gate_up.parts) == 1
    layer = load_model(tiny_paths["kmix_llama"])[0].layers[0]
    assert [p.type_name for p in layer.qkv.parts] == ["Q4_K", "Q6_K"]
    assert [p.type_name for p in layer.gate_up.parts] == ["Q5_K"]
    assert layer.qkv.out_features == sum(p.shape[0] for p in layer.qkv.parts) == (4 + 2 + 2) * 64


def test_embedding_rows_exact_and_tied_head_shares_them(blocks: None, tiny_paths: dict[str, Path]) -> None:
    for name in ("q8_llama", "kmix_llama", "small_qwen2"):
        path = tiny_paths[name]
        model, cfg = load_model(path)
        t = next(t for t in open_gguf(path).tensors if t.name == "token_embd.weight")
        table = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(cfg.vocab_size, cfg.hidden_size)
        ids = torch.tensor([[5, 0, 5], [cfg.vocab_size - 1, 17, 3]])
        assert isinstance(model.embed, BlockEmbedding)
        assert torch.equal(model.embed(ids), torch.from_numpy(np.ascontiguousarray(table[ids.numpy()])))
        if cfg.tie_word_embeddings:   # the head runs qmatmul on the embedding's very bytes
            assert model.head.parts[0].data.data_ptr() == model.embed.table.data.data_ptr()


# ---------------------------------------------------------------- engine guarantees in the default format


def _sig(out):  # type: ignore[no-untyped-def]
    c = out.outputs[0]
    return c.token_ids, [(p.chosen.token_id, p.chosen.logprob) for p in c.logprobs or []]


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (int(torch.randint(3, 70, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_default_format_batch_and_chunk_invariant(blocks: None, tiny_paths: dict[str, Path]) -> None:
    llm = LLM(str(tiny_paths["kmix_llama"]), max_num_batched_tokens=40, enable_prefix_caching=False)
    assert llm.engine.parts.model.weight_format == "gguf"
    prompts = _prompts(12, seed=2)
    params = [SamplingParams(max_tokens=8, temperature=0.0 if i % 2 else 0.9, seed=i, logprobs=2)
              for i in range(len(prompts))]
    together = llm.generate(prompts, params)   # 40-token steps: prompts chunked and mixed with decodes
    alone = [llm.generate([p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    assert [_sig(o) for o in together] == [_sig(o) for o in alone]


def test_default_format_speculative_decoding_identical(blocks: None, tiny_paths: dict[str, Path]) -> None:
    path = str(tiny_paths["small_qwen2"])
    prompts = [[5, 6, 7, 8] * 6, [40, 41, 42, 40, 41, 42, 40, 41]]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
    ref = LLM(path).generate(prompts, sp)
    ngram = LLM(path, speculative_method="ngram", num_speculative_tokens=3)
    assert [_sig(o) for o in ngram.generate(prompts, sp)] == [_sig(o) for o in ref]
    draft = LLM(path, speculative_model=path, num_speculative_tokens=3)   # the model drafting for itself
    assert [_sig(o) for o in draft.generate(prompts, sp)] == [_sig(o) for o in ref]
    assert draft.engine.spec_decode.num_accepted_tokens > 0


# ---------------------------------------------------------------- real models


def _real(name: str) -> Path:
    p = model_path(name)
    if not p.exists():
        pytest.skip(f"{p} is not cached (hitenter pull {name})")
    return p


REAL = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]


@pytest.mark.slow   # three real GGUF loads (the 1.5B one ~1 GB): the full suite's; the tiny models' bytes: above
@pytest.mark.parametrize("name", REAL + ["qwen2.5-coder-1.5b-instruct"])
def test_real_model_resident_bytes_within_5_percent_of_the_file(blocks: None, name: str) -> None:
    path = _real(name)
    model, _ = load_model(path)
    assert model.weight_bytes() <= 1.05 * _file_tensor_bytes(path)
    arena = model.weight_arena   # every matmul weight was copied into one arena (the map's pages released)
    for m in model.modules():
        for p in getattr(m, "parts", []):
            assert arena.owns(p.data)
    assert arena.used <= arena.size < arena.used + (2 << 20) + 64 * 1024


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_model_logits_and_perplexity_match_dense_fp32(blocks: None, name: str, fp32_model, gguf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = _real(name)
    ids = gguf_tokenizer(path).encode(english_text())
    ref = fp32_model(path)
    ref_logits, ref_ppl = _logits(ref, ids[:128]), perplexity(ref, ids, 512, PPL_TOKENS)
    model, _ = load_model(path)
    assert model.weight_format == "gguf"
    _assert_close(_logits(model, ids[:128]), ref_logits)
    ppl = perplexity(model, ids, 512, PPL_TOKENS)
    assert abs(ppl / ref_ppl - 1) < 0.01, (ppl, ref_ppl)
