"""The Qwen3.5 / 3.6 MTP block (hitenter/models/mtp.py) against llama.cpp's own MTP graph on the tiny files
with an MTP block (goldens: scripts/make_mtp_goldens.py, llama.cpp's MTP context driven through its C API):
for the same (token, h) rows at positions 0..39 the block's output after shared_head_norm and its logits
match llama.cpp's (F32: within float rounding; Q8_0 blocks: hitenter/testing/hybrid_goldens.py's bounds), and
the trunk's hidden state hitenter hands the block (after output_norm) is llama.cpp's h_nextn."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.errors import ModelLoadError
from hitenter.models.attention import AttentionMetadata
from hitenter.models.loader import load_model
from hitenter.models.mtp import load_mtp_head
from hitenter.testing.hybrid_goldens import TOL
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tiny_hybrids import write_tiny_hybrid
from hitenter.testing.tiny_qwen35 import write_tiny_mtp

FAMILIES = ["qwen35", "qwen35moe_mtp"]


def _golden(family: str) -> dict[str, np.ndarray]:
    path = GOLDENS / "families" / f"mtp_{family}.npz"
    assert path.is_file(), f"{path} missing: run scripts/make_mtp_goldens.py {family}"
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _file(family: str, gold: dict[str, np.ndarray], tmp_path: Path, quant: str | None) -> Path:
    suffix = "" if quant is None else "_" + quant.lower()
    path = write_tiny_mtp(tmp_path / f"{family}{suffix}.gguf", family, seed=int(gold["seed"]), quant=quant)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(gold[f"gguf{suffix}_sha256"]), (
        f"write_tiny_mtp({family!r}) no longer writes the golden's file: rerun scripts/make_mtp_goldens.py")
    return path


def _runs(family: str, tmp_path: Path, quant: str | None) -> tuple[dict[str, np.ndarray], np.ndarray, ...]:
    """(golden, trunk h [40, H], block output [40, H], block logits [40, V]) with the golden's h rows fed."""
    gold = _golden(family)
    suffix = "" if quant is None else "_" + quant.lower()
    net, _ = load_model(_file(family, gold, tmp_path, quant), dtype="float32" if quant is None else "auto")
    head = load_mtp_head(_file(family, gold, tmp_path, quant), net)
    toks = torch.tensor(gold["tokens"], dtype=torch.long)
    t = len(toks)
    pos, table = torch.arange(t), list(range(t // 16 + 1))
    caches = net.allocate_caches(len(table), 16, torch.float32, 1)
    net.restore_states(caches, [(-1, 0)])
    trunk = net(toks, pos, AttentionMetadata([0, t], [t], [table], pos, 16, state_slots=[0]), caches)
    cache = head.allocate_cache(len(table), 16, torch.float32)
    out = head(toks, torch.from_numpy(gold["mtp_h_in" + suffix]), pos, AttentionMetadata([0, t], [t], [table], pos, 16),
               cache)
    return gold, trunk.double().numpy(), out.double().numpy(), head.compute_logits(out).double().numpy()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_block_matches_llama_cpp_in_fp32(family: str, tmp_path: Path) -> None:
    gold, trunk, out, logits = _runs(family, tmp_path, None)
    ref = gold["mtp_logits"]
    worst = float(np.abs(logits - ref).max() / np.abs(ref).max())
    agree = int((logits.argmax(-1) == ref.argmax(-1)).sum())
    assert worst <= TOL and agree >= len(ref) - 1, (worst, agree)
    assert np.abs(out - gold["mtp_h"]).max() <= TOL * np.abs(gold["mtp_h"]).max()
    # the rows the drafter feeds it: the trunk's hidden state after output_norm, as llama.cpp's h_nextn
    assert np.abs(trunk - gold["target_h"]).max() <= TOL * np.abs(gold["target_h"]).max()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_block_on_q8_0_blocks_within_block_rounding(family: str, tmp_path: Path) -> None:
    gold, _, _, logits = _runs(family, tmp_path, "Q8_0")
    ref = gold["mtp_logits_q8_0"]
    diff = np.abs(logits - ref)
    agree = (logits.argmax(-1) == ref.argmax(-1)).mean()
    assert diff.mean() <= 0.05 * ref.std() and agree >= 0.9, (diff.mean(), ref.std(), agree)
    assert diff.max() <= 0.10 * np.abs(ref).max(), (diff.max(), np.abs(ref).max())


@pytest.mark.slow
def test_a_file_without_an_mtp_block_is_refused(tmp_path: Path) -> None:
    path = write_tiny_hybrid(tmp_path / "qwen35moe.gguf", "qwen35moe")
    net, _ = load_model(path)
    with pytest.raises(ModelLoadError, match="nextn_predict_layers is 0"):
        load_mtp_head(path, net)


def test_a_family_without_mtp_support_is_refused(tiny_llama_path: Path) -> None:
    net, _ = load_model(tiny_llama_path)
    with pytest.raises(ModelLoadError, match="no MTP drafter"):
        load_mtp_head(tiny_llama_path, net)
