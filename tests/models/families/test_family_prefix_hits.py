"""The families whose layers differ in window, RoPE or KV layout (OLMo 3's sliding-window pattern, Ministral 3's
query temperature, Llama 4's chunked and NoPE layers, Gemma 4's per-layer shapes) through the serving engine,
against llama.cpp's logits (tests/goldens/families/<family>.npz): after a prefix-cache hit of two blocks, each
request's last prompt row (positions past every window and chunk boundary of the tiny files) gives llama.cpp's
distribution, i.e. the engine's top logprobs equal log_softmax of llama.cpp's logits within float rounding.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from hitenter import LLM, SamplingParams
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tiny_families import FAMILIES, write_tiny_family

WINDOWED = [f for f in ("olmo3", "mistral3", "llama4", "gemma4", "gemma4_moe") if f in FAMILIES]
TOL = 1e-4   # of max |logit|, as test_llama_cpp_logits.py
TOL_FP16_GELU = 3e-3   # gemma4: llama.cpp's fp16-table GELU (test_llama_cpp_logits.py)
TOP = 5


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


@pytest.mark.slow
@pytest.mark.parametrize("family", WINDOWED)
def test_after_a_prefix_hit_the_engine_gives_llama_cpps_distribution(family: str, tmp_path: Path) -> None:
    with np.load(GOLDENS / "families" / f"{family}.npz") as z:
        gold = {k: z[k] for k in z.files}
    path = write_tiny_family(tmp_path / f"{family}.gguf", family, seed=int(gold["seed"]))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(gold["gguf_sha256"])
    tokens, ref = gold["tokens"].tolist(), gold["logits"]
    llm = LLM(str(path), dtype="float32", kv_cache_dtype="float32", block_size=16, max_num_batched_tokens=64)
    llm.generate([tokens[:32]], SamplingParams(max_tokens=1))   # caches blocks 0 and 1
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=TOP)
    worst = 0.0
    for n in (33, 36, 40):
        out = llm.generate([tokens[:n]], sp)[0]
        assert out.num_cached_tokens >= 32, (n, out.num_cached_tokens)
        pos = out.outputs[0].logprobs[0]
        want = _log_softmax(ref[n - 1])
        assert pos.chosen.token_id == int(ref[n - 1].argmax()), n
        ids = [t.token_id for t in pos.top]
        assert sorted(ids) == sorted(np.argsort(-ref[n - 1], kind="stable")[:TOP].tolist()), n
        for t in pos.top:
            worst = max(worst, abs(t.logprob - want[t.token_id]) / np.abs(ref).max())
    print(f"{family} after a prefix hit: max |logprob diff| / max |logit| = {worst:.1e}")
    assert worst <= 2 * (TOL_FP16_GELU if family.startswith("gemma4") else TOL)


@pytest.mark.slow
@pytest.mark.parametrize("kernel_from", [None, 8290], ids=["gemm", "decode-rows"])
def test_llama4_past_its_chunk_and_temperature_floor_matches_llama_cpp(kernel_from: int | None,
                                                                         tmp_path: Path) -> None:
    """llama4 at positions 8284..8299: the RoPE layers' queries past 8192 see only their own chunk, the NoPE
    layer's queries from position 8191 on are scaled by 1 + 0.1 ln 2 (llama.cpp's long golden run); the
    rows from `kernel_from` on take the generation path (the decode kernel over the chunk's view)."""
    if "llama4" not in FAMILIES:
        pytest.skip("no llama4 tiny family")
    import torch

    from hitenter.models.loader import load_model
    from hitenter.testing.model_runs import sequence_logits

    with np.load(GOLDENS / "families" / "llama4.npz") as z:
        gold = {k: z[k] for k in z.files}
    path = write_tiny_family(tmp_path / "llama4.gguf", "llama4", seed=int(gold["seed"]))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(gold["gguf_sha256"])
    model = load_model(path, dtype="float32")[0]
    tokens = gold["long_tokens"].astype(np.int64).tolist()
    n = len(tokens)
    with torch.no_grad():
        out = sequence_logits(model, tokens, kernel_from=n if kernel_from is None else kernel_from,
                              chunks=tuple(range(1024, n, 1024)))
    ref = gold["long_logits"]
    ours = out[-len(ref):].double().numpy()
    worst = float(np.abs(ours - ref).max() / np.abs(ref).max())
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    print(f"llama4 positions {n - len(ref)}..{n - 1}: argmax {agree}/{len(ref)}, max rel {worst:.1e}")
    assert agree >= len(ref) - 1 and worst <= TOL
