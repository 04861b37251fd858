"""The tiny families with Q8_0 goldens (scripts/make_family_goldens.py Q8_FAMILIES: OLMo 3, Ministral 3, Llama 4,
Gemma 4) in the file's own blocks (the default format, the native kernels) against llama.cpp on the same Q8_0
file, on the GEMM path and with every row a generation row (the decode kernel, the fused layer where it runs).

Bound: llama.cpp rounds each activation row to Q8_0 blocks before its int8 dot products, hitenter's kernels
round otherwise, so the two differ by the block type's rounding, not float rounding (as the hybrid families'
Q8_0 goldens, hitenter/testing/hybrid_goldens.py): mean |diff| <= 0.05 of the logits' std (0.10 with
experts, where a rounding can flip a routing choice), argmax equal at >= 90% of positions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.models.loader import load_model
from hitenter.testing.model_runs import sequence_logits
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tiny_families import FAMILIES, write_tiny_family

Q8 = [f for f in ("olmo3", "mistral3", "llama4", "gemma4", "gemma4_moe") if f in FAMILIES]
EXPERTS = ("llama4", "gemma4_moe")


@pytest.mark.parametrize("kernel_from", [40, 0], ids=["gemm", "generation-rows"])
@pytest.mark.parametrize("family", Q8)
def test_q8_0_blocks_match_llama_cpp_within_block_rounding(family: str, kernel_from: int, tmp_path: Path) -> None:
    with np.load(GOLDENS / "families" / f"{family}.npz") as z:
        gold = {k: z[k] for k in z.files}
    if "logits_q8_0" not in gold:
        pytest.fail(f"{family}.npz has no Q8_0 golden: run scripts/make_family_goldens.py {family}")
    path = write_tiny_family(tmp_path / f"{family}.gguf", family, seed=int(gold["seed"]), quant="Q8_0")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(gold["gguf_q8_0_sha256"])
    model = load_model(path)[0]
    assert model.weight_format != "dense", model.weight_format
    with torch.no_grad():
        ours = sequence_logits(model, gold["tokens"].tolist(), kernel_from=kernel_from).double().numpy()
    ref = gold["logits_q8_0"]
    diff = np.abs(ours - ref)
    agree = float((ours.argmax(-1) == ref.argmax(-1)).mean())
    print(f"{family} Q8_0 ({kernel_from=}): mean |diff| / std {diff.mean() / ref.std():.3f}, "
          f"max |diff| / max |logit| {diff.max() / np.abs(ref).max():.3f}, argmax equal {agree:.3f}")
    assert diff.mean() <= (0.10 if family in EXPERTS else 0.05) * ref.std() and agree >= 0.9
