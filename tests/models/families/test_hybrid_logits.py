"""The hybrid families on the recurrent mixers of models/recurrent (LFM2's short convolution, Mamba2) against
llama.cpp's logits on the tiny GGUFs of hitenter/testing/tiny_hybrids.py (goldens:
scripts/make_hybrid_goldens.py; the checks and their tolerances: hitenter/testing/hybrid_goldens.py): fp32
and Q8_0 logits, and a chunked / batched run's bits against the lone run's.

- lfm2, lfm2moe: the short convolution beside GQA attention with QK-norm (models/families/lfm2*.py);
- granitehybrid (dense, experts + shared expert, Bamba-style RoPE): Mamba2 beside attention, Granite's
  multipliers (models/families/granitehybrid.py);
- nemotron_h, nemotron_h_moe: each layer one of Mamba2, attention without RoPE, a squared-ReLU FFN or
  experts (models/families/nemotron_h*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitenter.testing.hybrid_goldens import (
    check_fp32,
    check_generation_rows,
    check_invariance,
    check_q8_0,
)

WITH_EXPERTS = ("lfm2moe", "granitehybrid_moe", "nemotron_h_moe")
FAMILIES = ("lfm2", "granitehybrid", "granitehybrid_rope", "nemotron_h", *WITH_EXPERTS)
ONE_PER_MIXER = ("lfm2", "granitehybrid", "nemotron_h")   # the Q8_0 invariance runs (slow)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_match_llama_cpp(family: str, tmp_path: Path) -> None:
    check_fp32(family, tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_blocks_match_llama_cpp_within_block_rounding(family: str, tmp_path: Path) -> None:
    check_q8_0(family, tmp_path, experts=family in WITH_EXPERTS)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_and_batched_bits_equal_the_lone_run(family: str, tmp_path: Path) -> None:
    check_invariance(family, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("family", ONE_PER_MIXER)
def test_chunked_and_batched_bits_equal_on_q8_0_blocks(family: str, tmp_path: Path) -> None:
    check_invariance(family, tmp_path, quant="Q8_0")


@pytest.mark.parametrize("family", ["lfm2", pytest.param("nemotron_h", marks=pytest.mark.slow)])
def test_generation_rows_of_several_sequences_give_their_lone_bits(family: str, tmp_path: Path) -> None:
    """Three sequences decoded together give each row the bits of the sequence run alone."""
    check_generation_rows(family, tmp_path)
