"""Qwen3.5 / 3.6 (qwen35, qwen35moe) and Qwen3-Next (qwen3next, also in its older fused-ssm_in layout):
models/families/qwen35.py and the Gated DeltaNet mixer (models/recurrent/gated_deltanet.py) against
llama.cpp's logits on the tiny GGUFs of hitenter/testing/tiny_qwen35.py (goldens:
scripts/make_hybrid_goldens.py; the checks and their tolerances: hitenter/testing/hybrid_goldens.py), on the
native delta-rule kernel where it is built and on the torch reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitenter.kernels.native import DELTA_RULE
from hitenter.testing.hybrid_goldens import check_fp32, check_invariance, check_q8_0

FAMILIES = ("qwen35", "qwen35moe", "qwen3next", "qwen3next_ssm_in")


@pytest.fixture(params=["native", "reference"])
def delta_rule_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The delta rule on the native kernel (skipped where it is not built) or on the torch reference."""
    if request.param == "reference":
        monkeypatch.setattr("hitenter.kernels.delta_rule.load", lambda: None)
    elif DELTA_RULE() is None:
        pytest.skip("no delta rule kernel here")
    return str(request.param)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_match_llama_cpp(family: str, delta_rule_path: str, tmp_path: Path) -> None:
    check_fp32(family, tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_blocks_match_llama_cpp_within_block_rounding(family: str, tmp_path: Path) -> None:
    check_q8_0(family, tmp_path, experts=family != "qwen35")


@pytest.mark.parametrize("family", ("qwen35", "qwen3next"))
def test_chunked_and_batched_bits_equal_the_lone_run(family: str, delta_rule_path: str, tmp_path: Path) -> None:
    check_invariance(family, tmp_path)


def test_chunked_and_batched_bits_equal_on_q8_0_blocks(tmp_path: Path) -> None:
    check_invariance("qwen35moe", tmp_path, quant="Q8_0")
