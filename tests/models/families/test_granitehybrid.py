"""Granite 4 hybrids (models/families/granitehybrid.py; the Mamba2 mixer of models/recurrent/mamba2.py),
dense FFN, experts + shared expert, and with RoPE (Bamba's rope.scaling.finetuned), against llama.cpp's logits on the tiny GGUFs of
hitenter/testing/tiny_hybrids.py (goldens: scripts/make_hybrid_goldens.py; the checks and their tolerances:
hitenter/testing/hybrid_goldens.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitenter.testing.hybrid_goldens import check_fp32, check_invariance, check_q8_0

FAMILIES = ("granitehybrid", "granitehybrid_moe", "granitehybrid_rope")


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_match_llama_cpp(family: str, tmp_path: Path) -> None:
    check_fp32(family, tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_blocks_match_llama_cpp_within_block_rounding(family: str, tmp_path: Path) -> None:
    check_q8_0(family, tmp_path, experts=family == "granitehybrid_moe")


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_and_batched_bits_equal_the_lone_run(family: str, tmp_path: Path) -> None:
    check_invariance(family, tmp_path)


@pytest.mark.slow
def test_chunked_and_batched_bits_equal_on_q8_0_blocks(tmp_path: Path) -> None:
    check_invariance("granitehybrid", tmp_path, quant="Q8_0")

