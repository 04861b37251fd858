"""Every model family of hitenter/testing/tiny_families.py against llama.cpp's own logits on the same file.

The goldens (tests/goldens/families/<family>.npz, scripts/make_family_goldens.py) are llama.cpp's per-position
logits (llama-cpp-python 0.3.36, CPU, F32 weights and KV cache, no flash attention) on a tiny random GGUF
written with llama.cpp's tensor names and metadata keys. Each test rewrites that GGUF with write_tiny_family
(its sha256 must equal the golden's, so a writer change forces regenerating the goldens), loads it with
hitenter in float32 and compares the logits at all 40 positions of the golden's token sequence.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hitenter.errors import ModelLoadError
from hitenter.models.loader import load_model
from hitenter.testing.model_runs import Runner
from hitenter.testing.paths import GOLDENS as ALL_GOLDENS
from hitenter.testing.tiny_families import FAMILIES, write_tiny_family
from hitenter.testing.tiny_model import add_tokenizer

GOLDENS = ALL_GOLDENS / "families"

# Tolerance: max |hitenter - llama.cpp| <= TOL * max |llama.cpp logit|, over all positions and the vocabulary.
# Both sides compute in float32 from the same F32 weights and differ only in rounding: summation order in
# the matmuls, softmax and RMS norms (ggml accumulates dot products in float32 SIMD lanes, RMS sums in
# double), exp/tanh/sin/cos implementations, RoPE angle arithmetic. float32's epsilon is 1.2e-7; through a
# few layers of 64..128-long dot products that adds up to ~1e-6 of the logit scale: the goldens' own
# float64 check (`ref64_max_rel_diff` in each npz, scripts/make_family_goldens.py) puts llama.cpp at
# 1e-7 .. 1e-6 of exact arithmetic, HF transformers' float32 (`hf_max_rel_diff`) at ~1e-6 of llama.cpp,
# and at llama3's positions 8284..8299 float32 RoPE angles (pos * freq up to 8300 rad) add ~5e-6. So 1e-4
# leaves a wide margin for rounding and none for a formula error: a wrong norm, rope convention, scale,
# window or routing moves these logits by 0.1 .. 1 of their scale.
TOL = 1e-4
# gemma2 / gemma3 / gemma4 run GeGLU, and ggml's CPU GELU (GGML_GELU_FP16, on by default) rounds its input to
# fp16 and reads the result from an fp16 table: llama.cpp's logits sit `ref64_exact_gelu_max_rel_diff`
# (~6e-4 .. 9e-4 here; gemma4, two GELUs per layer: 1.5e-3) from an exact tanh-GELU, and HF's exact GELU as
# far. An implementation with an exact GELU can only match that closely, so these families get a looser
# bound, still far below what a formula error does.
TOL_FP16_GELU = 3e-3
FP16_GELU_FAMILIES = ("gemma2", "gemma3", "gemma4", "gemma4_moe")


def _golden(family: str) -> dict[str, np.ndarray]:
    path = GOLDENS / f"{family}.npz"
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/make_family_goldens.py {family}")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _tiny(family: str, gold: dict[str, np.ndarray], tmp_path: Path) -> Path:
    path = write_tiny_family(tmp_path / f"{family}.gguf", family, seed=int(gold["seed"]))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sha == str(gold["gguf_sha256"]), (
        f"write_tiny_family({family!r}) no longer writes the golden's file: regenerate with "
        f"scripts/make_family_goldens.py {family}")
    return path


def _compare(ours: torch.Tensor, ref: np.ndarray, tol: float, what: str) -> None:
    ours_np = ours.double().numpy()
    assert ours_np.shape == ref.shape, f"{what}: logits shape {ours_np.shape}, llama.cpp {ref.shape}"
    agree = int((ours_np.argmax(-1) == ref.argmax(-1)).sum())
    worst = float(np.abs(ours_np - ref).max() / np.abs(ref).max())
    print(f"{what}: argmax equal at {agree}/{len(ref)}, max |diff| / max |logit| = {worst:.1e}")
    assert agree >= len(ref) - 1, f"{what}: argmax equal to llama.cpp at only {agree}/{len(ref)} positions"
    assert worst <= tol, f"{what}: max |diff| = {worst:.2e} of max |logit| (tolerance {tol:.0e})"


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_llama_cpp(family: str, tmp_path: Path) -> None:
    gold = _golden(family)
    path = _tiny(family, gold, tmp_path)
    model = load_model(path, dtype="float32")[0]
    tokens = gold["tokens"].tolist()
    with torch.no_grad():
        ours = Runner(model, 1, len(tokens)).step({0: tokens})[0]
    tol = TOL_FP16_GELU if family in FP16_GELU_FAMILIES else TOL
    _compare(ours, gold["logits"], tol, family)


@pytest.mark.slow
def test_llama3_past_8192_matches_llama_cpp(tmp_path: Path) -> None:
    """llama3's rope_freqs at positions 8284..8299 (llama.cpp applies the factors at every position; an
    implementation that switched on a position threshold would differ here)."""
    gold = _golden("llama3")
    model = load_model(_tiny("llama3", gold, tmp_path), dtype="float32")[0]
    tokens = gold["long_tokens"].astype(np.int64).tolist()
    runner = Runner(model, 1, len(tokens))
    with torch.no_grad():
        for start in range(0, len(tokens), 1024):   # a chunked prefill: one 8300-token step is needlessly big
            out = runner.step({0: tokens[start:start + 1024]})[0]
    last = len(gold["long_positions"])
    assert gold["long_positions"][-1] == len(tokens) - 1
    _compare(out[-last:], gold["long_logits"], TOL, "llama3 positions 8284..8299")


def test_phi3_longrope_short_factors_within_the_original_context(tmp_path: Path) -> None:
    """Served within rope.scaling.original_context_length (256), LongRoPE's short factors, as llama.cpp at
    n_ctx 256 (the main golden: n_ctx 4096, the long factors)."""
    gold = _golden("phi3_partial")
    model = load_model(_tiny("phi3_partial", gold, tmp_path), dtype="float32", max_model_len=256)[0]
    tokens = gold["tokens"].tolist()
    with torch.no_grad():
        ours = Runner(model, 1, len(tokens)).step({0: tokens})[0]
    _compare(ours[32:40], gold["logits_short"], TOL, "phi3_partial short factors")


@pytest.mark.parametrize("family", FAMILIES)
def test_golden_agrees_with_hf_transformers(family: str) -> None:
    """The goldens themselves: where transformers' GGUF loader knows the architecture, its float32 logits
    (from the same file, with the config fixes recorded in `hf_config_fixes`) at positions 32..39 agree
    with llama.cpp's (phi3_partial: with `logits_short`, the short LongRoPE factors HF picks at 40 tokens)."""
    gold = _golden(family)
    if "hf_logits" not in gold:
        pytest.skip(f"no HF logits for {family}: transformers' GGUF loader cannot load it (HF_CONFIG_FIXES)")
    rows = gold["hf_positions"]
    ref = gold["logits_short"] if family == "phi3_partial" else gold["logits"][rows]
    tol = TOL_FP16_GELU if family in FP16_GELU_FAMILIES else TOL
    _compare(torch.from_numpy(gold["hf_logits"]), ref, tol, f"{family} HF vs llama.cpp")


def test_unknown_architecture_fails_at_load_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "unknown.gguf"
    w = gguf.GGUFWriter(str(path), "tinyfancyarch")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    add_tokenizer(w)
    w.add_tensor("token_embd.weight", np.zeros((310, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError) as err:
        load_model(path, dtype="float32")
    msg = str(err.value)
    assert "tinyfancyarch" in msg and "\n" not in msg.strip(), msg
