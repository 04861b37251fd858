"""Nemotron-H and Nemotron-H MoE (models/families/nemotron_h.py, nemotron_h_moe.py: Mamba2, attention
without RoPE and squared-ReLU FFN or expert layers) against llama.cpp's logits on the tiny GGUFs of
hitenter/testing/tiny_hybrids.py (goldens: scripts/make_hybrid_goldens.py; the checks and their
tolerances: hitenter/testing/hybrid_goldens.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitenter.testing.hybrid_goldens import check_fp32, check_invariance, check_q8_0

FAMILIES = ("nemotron_h", "nemotron_h_moe")


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_match_llama_cpp(family: str, tmp_path: Path) -> None:
    check_fp32(family, tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_blocks_match_llama_cpp_within_block_rounding(family: str, tmp_path: Path) -> None:
    check_q8_0(family, tmp_path, experts=family == "nemotron_h_moe")


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_and_batched_bits_equal_the_lone_run(family: str, tmp_path: Path) -> None:
    check_invariance(family, tmp_path)


@pytest.mark.slow
def test_chunked_and_batched_bits_equal_on_q8_0_blocks(tmp_path: Path) -> None:
    check_invariance("nemotron_h", tmp_path, quant="Q8_0")
