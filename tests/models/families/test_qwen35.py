"""Qwen3.5 / 3.6 (qwen35, also at real head sizes: qwen35_wide; qwen35moe, also with merged gate_up experts)
and Qwen3-Next (qwen3next, also in its older fused-ssm_in layout):
models/families/qwen35.py and the Gated DeltaNet mixer (models/recurrent/gated_deltanet.py) against
llama.cpp's logits on the tiny GGUFs of hitenter/testing/tiny_qwen35.py (goldens:
scripts/make_hybrid_goldens.py; the checks and their tolerances: hitenter/testing/hybrid_goldens.py), on the
fused Gated DeltaNet kernel, on the native delta-rule kernel alone and on the torch reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest
import torch

from hitenter.errors import ModelLoadError
from hitenter.kernels import BlockWeight
from hitenter.kernels.native import DELTA_RULE, GATED_DELTANET
from hitenter.models.experts import ExpertWeight
from hitenter.models.families import family_for
from hitenter.models.families.qwen35 import imrope_axis, split_gate_up
from hitenter.models.gguf import open_gguf, read_gguf_metadata
from hitenter.models.loader import load_model
from hitenter.testing.hybrid_goldens import (
    check_fp32,
    check_generation_rows,
    check_invariance,
    check_q8_0,
    golden,
    lone_logits,
    tiny,
)
from hitenter.testing.tiny_hybrids import write_tiny_hybrid

FAMILIES = ("qwen35", "qwen35_wide", "qwen35moe", "qwen35moe_gate_up", "qwen3next", "qwen3next_ssm_in")
FAST = ("qwen35", "qwen35_wide", "qwen3next")   # the fast lane's; the others run in the full suite (a few seconds each)


def _lanes(families: tuple[str, ...] | list[str]) -> list[object]:
    return [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in families]


@pytest.fixture(params=["fused", pytest.param("native", marks=pytest.mark.slow),
                        pytest.param("reference", marks=pytest.mark.slow)])
def delta_rule_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The layer's recurrent part on the fused kernel (kernels/gated_deltanet.py), or unfused: the delta rule on
    its native kernel, or everything on the torch reference (each skipped where its kernel is not built)."""
    if request.param == "fused":
        if GATED_DELTANET() is None:
            pytest.skip("no fused Gated DeltaNet kernel here")
        return "fused"
    monkeypatch.setattr("hitenter.kernels.gated_deltanet.load", lambda: None)
    if request.param == "reference":
        monkeypatch.setattr("hitenter.kernels.delta_rule.load", lambda: None)
    elif DELTA_RULE() is None:
        pytest.skip("no delta rule kernel here")
    return str(request.param)


@pytest.mark.parametrize("family", _lanes(FAMILIES))
def test_fp32_logits_match_llama_cpp(family: str, delta_rule_path: str, tmp_path: Path) -> None:
    check_fp32(family, tmp_path)


# qwen35moe_gate_up differs from qwen35moe only in how the experts are stored (its split on blocks is checked
# below); its own random router flips expert choices under Q8_0 rounding more often than the bound allows
@pytest.mark.parametrize("family", [f if f == "qwen35" else pytest.param(f, marks=pytest.mark.slow)
                                    for f in FAMILIES if f != "qwen35moe_gate_up"])
def test_q8_0_blocks_match_llama_cpp_within_block_rounding(family: str, tmp_path: Path) -> None:
    check_q8_0(family, tmp_path, experts=family not in ("qwen35", "qwen35_wide"))


def test_merged_gate_up_experts_split_into_the_same_values_on_blocks_and_dense() -> None:
    """llama.cpp's ffn_gate_up_exps (per expert F gate rows, then F up rows), as Q8_0 blocks and as fp32."""
    e, f, h = 3, 32, 64
    dense = torch.randn(e, 2 * f, h, generator=torch.Generator().manual_seed(0))
    raw = gguf.quants.quantize(dense.reshape(e * 2 * f, h).numpy(), gguf.GGMLQuantizationType.Q8_0)
    blocks = ExpertWeight(e, 2 * f, h, blocks=BlockWeight(torch.from_numpy(raw), int(gguf.GGMLQuantizationType.Q8_0),
                                                          (e * 2 * f, h)))
    exact = blocks.dequantize()
    gate, up = split_gate_up(blocks)
    assert torch.equal(gate.dequantize(), exact[:, :f]) and torch.equal(up.dequantize(), exact[:, f:])
    gate, up = split_gate_up(dense)
    assert torch.equal(gate, dense[:, :f]) and torch.equal(up, dense[:, f:])


@pytest.mark.slow
@pytest.mark.parametrize("family", ("qwen35", "qwen3next"))
def test_chunked_and_batched_bits_equal_the_lone_run(family: str, delta_rule_path: str, tmp_path: Path) -> None:
    check_invariance(family, tmp_path)


@pytest.mark.slow
def test_chunked_and_batched_bits_equal_on_q8_0_blocks(tmp_path: Path) -> None:
    check_invariance("qwen35moe", tmp_path, quant="Q8_0")


def _meta(tmp_path: Path, family: str = "qwen35") -> dict[str, Any]:
    return read_gguf_metadata(open_gguf(write_tiny_hybrid(tmp_path / f"{family}.gguf", family)))


def test_layer_kinds_and_the_mtp_block(tmp_path: Path) -> None:
    """qwen35: 5 blocks of which nextn_predict_layers 1 is the MTP block (not run); every 4th trunk layer
    attends. qwen3next: attention.recurrent_layers wins over full_attention_interval."""
    meta = _meta(tmp_path)
    cfg = family_for("qwen35").config(meta, None)
    assert cfg.num_layers == 4 and cfg.layer_types == ("gated_deltanet",) * 3 + ("attention",)
    cfg = family_for("qwen35").config({**meta, "qwen35.full_attention_interval": 2}, None)
    assert cfg.layer_types == ("gated_deltanet", "attention") * 2
    nxt = _meta(tmp_path, "qwen3next")
    assert nxt["qwen3next.full_attention_interval"] == 4
    assert family_for("qwen3next").config(nxt, None).layer_types == ("gated_deltanet", "attention") * 2
    with pytest.raises(ModelLoadError, match="recurrent_layers has 3 entries for 4 layers"):
        family_for("qwen3next").config({**nxt, "qwen3next.attention.recurrent_layers": [True] * 3}, None)
    with pytest.raises(ModelLoadError, match="leaves no trunk"):
        family_for("qwen35").config({**meta, "qwen35.nextn_predict_layers": 5}, None)


def test_multi_axis_rope_sections(tmp_path: Path) -> None:
    """Real files' sections ([11, 11, 10, 0] over 64 rotated dims) put every pair on a text position axis;
    sections that leave a rotated pair to the 4th axis are refused at load, naming the key."""
    assert {imrope_axis(i, [11, 11, 10, 0]) for i in range(32)} == {"t", "h", "w"}
    assert [imrope_axis(i, [3, 3, 2, 0]) for i in range(8)] == ["t", "h", "w", "t", "h", "w", "t", "h"]
    meta = _meta(tmp_path)
    with pytest.raises(ModelLoadError, match="dimension_sections"):
        family_for("qwen35").config({**meta, "qwen35.rope.dimension_sections": [2, 2, 2, 2]}, None)


@pytest.mark.slow
def test_bfloat16_weights_run_and_agree(tmp_path: Path) -> None:
    """bf16 projections (the recurrence stays fp32): the MoE's fp32 output is cast back to the activations'
    dtype, and the logits stay near llama.cpp's F32 ones (bf16 rounding only)."""
    gold = golden("qwen35moe")
    model = load_model(tiny("qwen35moe", gold, tmp_path), dtype="bfloat16")[0]
    ours, ref = lone_logits(model, gold["tokens"].tolist()).double().numpy(), gold["logits"]
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    assert abs(ours - ref).mean() <= 0.1 * ref.std()


@pytest.mark.parametrize("family", ["qwen35", pytest.param("qwen3next", marks=pytest.mark.slow)])
def test_generation_rows_of_several_sequences_give_their_lone_bits(family: str, delta_rule_path: str,
                                                                   tmp_path: Path) -> None:
    """Three sequences decoded together give each row the bits of the sequence run alone."""
    check_generation_rows(family, tmp_path)
