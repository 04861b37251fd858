"""The checks every hybrid family's test runs against llama.cpp's goldens (tests/goldens/families/<family>.npz,
scripts/make_hybrid_goldens.py) on the tiny GGUFs of tiny_hybrids.py, and the invariance check of the
recurrent state (chunks and batches give the lone run's bits).

Tolerances. F32 (`check_fp32`): max |hitenter - llama.cpp| <= TOL (1e-4) of max |llama.cpp logit| with the
argmax equal at >= 39 of 40 positions: both sides compute in float32 from the same weights and differ by
rounding only (tests/models/families/test_llama_cpp_logits.py says why 1e-4 leaves no room for a formula
error). Q8_0 (`check_q8_0`): llama.cpp rounds each activation row to Q8_0 blocks before its int8 dot
products and hitenter's native kernels round their own way, so the two sit about as far apart as on the
plain tiny families (the tiny llama's Q8_0 copy: 2.4% of max |logit|, qwen3moe's 18% where a rounding flips
an expert choice): mean |diff| <= 5% of the logits' std and argmax equal at >= 90% of positions (as
tests/models/test_formats.py bounds blocks against dense), plus max |diff| <= 10% of max |logit| for a
model without experts. A model with experts gets mean |diff| <= 10% of the std instead (measured 1.0% to
4.3% here; a rounding that flips one expert choice moves that row's whole output, and where it flips
depends on the CPU's kernel variant).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from hitenter.models.loader import load_model
from hitenter.testing.model_runs import Runner
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tiny_hybrids import write_tiny_hybrid

TOL = 1e-4


def golden(family: str) -> dict[str, np.ndarray]:
    path = GOLDENS / "families" / f"{family}.npz"
    assert path.is_file(), f"{path} missing: run scripts/make_hybrid_goldens.py {family}"
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def tiny(family: str, gold: dict[str, np.ndarray], tmp_path: Path, quant: str | None = None) -> Path:
    """The golden's GGUF, rewritten (its sha256 must be the golden's: a writer change forces new goldens)."""
    suffix = "" if quant is None else "_" + quant.lower()
    path = write_tiny_hybrid(tmp_path / f"{family}{suffix}.gguf", family, seed=int(gold["seed"]), quant=quant)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(gold[f"gguf{suffix}_sha256"]), (
        f"write_tiny_hybrid({family!r}, quant={quant!r}) no longer writes the golden's file: regenerate with "
        f"scripts/make_hybrid_goldens.py {family}")
    return path


def lone_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """fp32 logits of every position: the whole sequence in one step, alone."""
    with torch.no_grad():
        return Runner(model, 1, len(tokens)).step({0: tokens})[0]


def check_fp32(family: str, tmp_path: Path) -> float:
    """F32 file, dense fp32 model vs llama.cpp (module docstring); returns max |diff| / max |logit|."""
    gold = golden(family)
    model = load_model(tiny(family, gold, tmp_path), dtype="float32")[0]
    ours, ref = lone_logits(model, gold["tokens"].tolist()).double().numpy(), gold["logits"]
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    worst = float(np.abs(ours - ref).max() / np.abs(ref).max())
    print(f"{family} fp32: argmax equal at {agree}/{len(ref)}, max |diff| / max |logit| = {worst:.1e}")
    assert agree >= len(ref) - 1, f"{family}: argmax equal to llama.cpp at only {agree}/{len(ref)} positions"
    assert worst <= TOL, f"{family}: max |diff| = {worst:.2e} of max |logit| (tolerance {TOL:.0e})"
    return worst


def check_q8_0(family: str, tmp_path: Path, experts: bool) -> None:
    """The Q8_0 copy in the file's own blocks (the default format) vs llama.cpp on it (module docstring)."""
    gold = golden(family)
    model = load_model(tiny(family, gold, tmp_path, "Q8_0"))[0]
    assert model.weight_format != "dense", model.weight_format
    ours, ref = lone_logits(model, gold["tokens"].tolist()).double().numpy(), gold["logits_q8_0"]
    diff = np.abs(ours - ref)
    agree = float((ours.argmax(-1) == ref.argmax(-1)).mean())
    print(f"{family} Q8_0: mean |diff| / std {diff.mean() / ref.std():.3f}, max |diff| / max |logit| "
          f"{diff.max() / np.abs(ref).max():.3f}, argmax equal {agree:.3f}")
    assert diff.mean() <= (0.10 if experts else 0.05) * ref.std() and agree >= 0.9, (diff.mean(), ref.std(), agree)
    if not experts:
        assert diff.max() <= 0.10 * np.abs(ref).max(), (diff.max(), np.abs(ref).max())


def check_invariance(family: str, tmp_path: Path, quant: str | None = None) -> None:
    """The golden's tokens fed in chunks of other sizes, and batched with two other sequences cut elsewhere,
    give the bits of the lone one-step run at every position."""
    gold = golden(family)
    kw = {"dtype": "float32"} if quant is None else {}
    model = load_model(tiny(family, gold, tmp_path, quant), **kw)[0]
    tokens = gold["tokens"].tolist()
    lone = lone_logits(model, tokens)
    chunks = (5, 11, 1, 1, 15, 7)
    assert sum(chunks) == len(tokens)
    r = Runner(model, 1, len(tokens))
    out, start = [], 0
    with torch.no_grad():
        for c in chunks:
            out.append(r.step({0: tokens[start:start + c]})[0])
            start += c
    assert torch.equal(torch.cat(out), lone), f"{family}: chunked prefill changed the bits"
    others = [tokens[::-1], [(t * 7) % 300 + 3 for t in tokens]]
    cuts = [(0, 9, 10, 26, 40), (0, 3, 20, 21, 40), (0, 14, 30, 39, 40)]
    r = Runner(model, 3, len(tokens))
    got: list[list[torch.Tensor]] = [[], [], []]
    with torch.no_grad():
        for step in range(4):
            feed = {i: seq[cuts[i][step]:cuts[i][step + 1]] for i, seq in enumerate([tokens, *others])}
            for i, lg in r.step({i: t for i, t in feed.items() if t}).items():
                got[i].append(lg)
    assert torch.equal(torch.cat(got[0]), lone), f"{family}: batched with other sequences changed the bits"


def check_generation_rows(family: str, tmp_path: Path) -> None:
    """Three sequences decoded together (their one-row spans updated in one batched call) give each row the
    bits of the sequence run alone, one token per step."""
    gold = golden(family)
    model = load_model(tiny(family, gold, tmp_path), dtype="float32")[0]
    toks = gold["tokens"].tolist()
    prompts, follow = [toks[:9], toks[9:23], toks[23:26]], [toks[30:36], toks[34:40], toks[26:32]]
    lone = []
    with torch.no_grad():
        for p, f in zip(prompts, follow, strict=True):
            r = Runner(model, 1, 32)
            lone.append([r.step({0: p})[0][-1:]] + [r.step({0: [t]})[0] for t in f])
        r = Runner(model, 3, 32)
        first = r.step(dict(enumerate(prompts)))
        got = [[first[i][-1:]] for i in range(3)]
        for j in range(len(follow[0])):
            for i, lg in r.step({i: [follow[i][j]] for i in range(3)}).items():
                got[i].append(lg)
    for i in range(3):
        assert torch.equal(torch.cat(got[i]), torch.cat(lone[i])), f"{family}: sequence {i}'s generation rows"
