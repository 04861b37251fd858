"""Mixture-of-experts FFN (hitenter/models/moe.py): grouped execution vs the per-token reference, batch
invariance, routing details (norm_topk, ties, unused experts, gating variants), GGUF 3-D expert tensors
and ownership of the expert bytes by the weight arena.

The reference (`reference_moe`) loops over tokens and runs each expert product on its own row: dense
experts as `W @ v`, blocks through qmatmul on one row (the kernel, itself checked against the
dequantized weights by tests/kernels/test_qmatmul.py; here once more, loosely, through the dequantized experts).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from hitenter.errors import ModelLoadError
from hitenter.kernels import BlockWeight
from hitenter.models.block_linear import own_block_bytes
from hitenter.models.moe import ExpertWeight, MoEFFN, dense_experts, expert_weights, reference_moe
from hitenter.testing.tiny_model import random_kquant

Q = gguf.GGMLQuantizationType
FORMATS = ["dense", "Q4_0", "Q8_0", "Q4_K"]
E, H, FF, K = 8, 256, 256, 3


def experts(fmt: str, e: int, out: int, inp: int, rng: np.random.Generator) -> ExpertWeight:
    """Random experts of one projection in `fmt` (dense fp32, or a block type's valid blocks)."""
    w = (rng.standard_normal((e * out, inp)) * 0.1).astype(np.float32)
    if fmt == "dense":
        return dense_experts(torch.from_numpy(w).view(e, out, inp))
    qt = Q[fmt]
    raw = random_kquant(qt, e * out, inp, rng) if fmt.endswith("_K") else gguf.quants.quantize(w, qt)
    return ExpertWeight(e, out, inp, blocks=BlockWeight(torch.from_numpy(raw), int(qt), (e * out, inp)))


def layer(fmt: str, seed: int = 0, n_expert: int = E, top_k: int = K, **kw: object) -> tuple[MoEFFN, dict]:
    rng = np.random.default_rng(seed)
    args = {"router": torch.from_numpy(rng.standard_normal((n_expert, H)).astype(np.float32)) * 0.2,
            "gate": experts(fmt, n_expert, FF, H, rng), "up": experts(fmt, n_expert, FF, H, rng),
            "down": experts(fmt, n_expert, H, FF, rng), "top_k": top_k, "norm_topk": True, **kw}
    return MoEFFN(**args), args


def rows(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, H, generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("fmt", FORMATS)
def test_grouped_matches_reference(fmt: str) -> None:
    m, args = layer(fmt)
    x = rows(21)
    assert close(m(x), reference_moe(x, **args))


@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0", "Q4_K"])
def test_blocks_match_dequantized_experts(fmt: str) -> None:
    """The kernel's products against the dequantized experts' fp32 math (activations rounded to int8
    blocks, as for the dense layers; measured mean |diff| 2.2% of mean |y| for Q4_K, chained products)."""
    m, args = layer(fmt)
    dense = {**args, **{p: dense_experts(args[p].dequantize()) for p in ("gate", "up", "down")}}
    x = rows(9)
    y, ref = m(x), reference_moe(x, **dense)
    assert float((y - ref).abs().mean()) < 0.05 * float(ref.abs().mean())


@pytest.mark.parametrize("fmt", ["dense", "Q4_K", "Q4_0"])
def test_batch_invariance(fmt: str) -> None:
    """A row's output bits alone equal its bits in any batch of 1..17 rows, at any position."""
    m, _ = layer(fmt)
    x = rows(17, seed=2)
    alone = torch.cat([m(x[i:i + 1]) for i in range(17)])
    for n in range(1, 18):
        others = rows(n, seed=100 + n)
        for pos in {0, n - 1}:
            batch = others.clone()
            batch[pos] = x[n - 1]
            assert torch.equal(m(batch)[pos], alone[n - 1]), (n, pos)
    assert torch.equal(m(x), alone)


def test_decode_row_matches_reference() -> None:
    m, args = layer("Q4_K", top_k=8, n_expert=16)
    x = rows(1, seed=5)
    assert close(m(x), reference_moe(x, **args))


@pytest.mark.parametrize("norm", [True, False])
def test_norm_topk(norm: bool) -> None:
    m, args = layer("dense", norm_topk=norm)
    x = rows(11)
    _, w = m.route(x)
    sums = w.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6) == norm
    assert close(m(x), reference_moe(x, **args))


@pytest.mark.parametrize("gating", ["sigmoid", "softmax_weight"])
def test_other_gatings(gating: str) -> None:
    """Sigmoid gating with a selection bias (DeepSeek-V3's exp_probs_b) and softmax-after-top-k (gpt-oss),
    with a router bias and a weights scale."""
    g = torch.Generator().manual_seed(3)
    kw = {"gating": gating, "router_bias": torch.randn(E, generator=g), "weights_scale": 2.5,
          "selection_bias": torch.randn(E, generator=g) if gating == "sigmoid" else None}
    m, args = layer("Q8_0", **kw)
    x = rows(10)
    assert close(m(x), reference_moe(x, **args))


def test_gpt_oss_routing_and_biases() -> None:
    """gpt-oss's mixture: router bias, top-k on logits then softmax over the k, no renormalisation,
    expert biases on gate/up/down, swiglu_oai; grouped vs reference and batch invariance."""
    g = torch.Generator().manual_seed(4)
    bias = (torch.randn(E, FF, generator=g), torch.randn(E, FF, generator=g), torch.randn(E, H, generator=g))
    m, args = layer("Q8_0", gating="softmax_weight", act="swiglu_oai", norm_topk=False,
                    router_bias=torch.randn(E, generator=g), expert_bias=bias)
    x = rows(12) * 4   # large enough that swiglu_oai's clamps at +-7 take effect
    y = m(x)
    assert close(y, reference_moe(x, **args))
    assert all(torch.equal(m(x[i:i + 1])[0], y[i]) for i in range(12))


def test_tie_goes_to_lower_expert() -> None:
    """Exactly equal router logits (exact integer sums): the lower expert index wins, grouped and reference."""
    _, args = layer("dense", top_k=4)
    scores = torch.tensor([0.0, 2.0, 1.0, 2.0, 1.0, 1.0, 0.0, 2.0])
    args["router"] = (scores / H).unsqueeze(1).expand(E, H).contiguous()
    m = MoEFFN(**args)
    x = torch.ones(3, H)
    idx, w = m.route(x)
    assert idx.tolist() == [[1, 3, 7, 2]] * 3
    assert torch.equal(w[:, 0], w[:, 1]) and torch.equal(w[:, 1], w[:, 2])
    assert close(m(x), reference_moe(x, **args))


def test_unpicked_expert_never_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    m, args = layer("Q4_K", router_bias=torch.tensor([0, 0, 0, 0, 0, 0, -1e4, 0.0]))

    def boom(*a: object) -> None:
        raise AssertionError("expert 6 ran")

    monkeypatch.setattr(m.gate_up[6], "forward", boom)
    monkeypatch.setattr(m.down[6], "forward", boom)
    x = rows(32)
    assert 6 not in m.route(x)[0].unique().tolist()
    assert close(m(x), reference_moe(x, **args))


def test_padding_rows_are_not_routed() -> None:
    m, _ = layer("Q4_K")
    x = rows(8)
    y = m(x, n_real=5)
    assert torch.equal(y[:5], m(x[:5])) and not y[5:].any()


class Holder(nn.Module):
    def __init__(self, ffn: MoEFFN) -> None:
        super().__init__()
        self.ffn = ffn


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_K"])
def test_owned_bytes_fuse_gate_up(fmt: str) -> None:
    """own_block_bytes (what the loader calls) moves every expert into the arena (Q4_0 repacked where
    the kernel does), puts gate before up so each expert's gate+up runs as one qmatmul; same bits."""
    m, _ = layer(fmt)
    x = rows(13)
    before = m(x)
    assert all(gu.fused is None for gu in m.gate_up)   # the file's two tensors: two calls
    model = Holder(m)
    own_block_bytes(model)
    arena = model.weight_arena
    assert all(arena.owns(p.data) for lin in (*m.gate_up, *m.down) for p in lin.parts)
    assert all(gu.fused is not None and gu.fused.shape == (2 * FF, H) for gu in m.gate_up)
    assert torch.equal(m(x), before)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_K"])
def test_gguf_expert_tensor_orientation(tmp_path: Path, qtype: str) -> None:
    """A [E, out, in] array written as llama.cpp stores experts (ggml ne = [in, out, E]) reads back with
    expert e's [out, in] rows equal to the array's e-th matrix (through its type's rounding)."""
    rng = np.random.default_rng(7)
    e, out, inp = 4, 32, 256
    arr = (rng.standard_normal((e, out, inp)) * 0.1).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "qwen3moe")
    if qtype == "F32":
        w.add_tensor("blk.0.ffn_up_exps.weight", arr)
    elif qtype == "F16":
        w.add_tensor("blk.0.ffn_up_exps.weight", arr.astype(np.float16))
    else:
        raw = (random_kquant(Q[qtype], e * out, inp, rng).reshape(e, out, -1) if qtype == "Q4_K"
               else gguf.quants.quantize(arr, Q[qtype]))
        arr = gguf.quants.dequantize(raw, Q[qtype]).reshape(e, out, inp)
        w.add_tensor("blk.0.ffn_up_exps.weight", raw, raw_dtype=Q[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = gguf.GGUFReader(str(tmp_path / "x.gguf"))
    assert [int(d) for d in reader.tensors[0].shape] == [inp, out, e]
    ew = expert_weights(reader, "blk.0.ffn_up_exps.weight")
    assert (ew.blocks is not None) == qtype.startswith("Q")
    want = torch.from_numpy(arr.astype(np.float16).astype(np.float32) if qtype == "F16" else arr)
    for i in range(e):
        x = ew.expert(i)
        got = x.dequantize() if isinstance(x, BlockWeight) else x
        assert torch.equal(got, want[i]), i
    assert torch.equal(expert_weights(reader, "blk.0.ffn_up_exps.weight", dense=True).dense, want)
    with pytest.raises(ModelLoadError):
        expert_weights(reader, "blk.0.ffn_gate_exps.weight")


def test_ungated_relu2_experts_match_the_reference() -> None:
    """Nemotron-H MoE's experts: no gate projection, down(relu(up x)^2), sigmoid routing with a selection
    bias, renormalised and scaled; the grouped path against the one-token reference."""
    g = torch.Generator().manual_seed(3)
    e, h, f, n = 6, 32, 24, 11
    router = torch.randn(e, h, generator=g)
    up, down = dense_experts(torch.randn(e, f, h, generator=g) * 0.3), dense_experts(torch.randn(e, h, f, generator=g) * 0.3)
    bias = torch.randn(e, generator=g)
    x = torch.randn(n, h, generator=g)
    kw = dict(top_k=2, norm_topk=True, gating="sigmoid", act="relu2", selection_bias=bias, weights_scale=2.5)
    ours = MoEFFN(router, None, up, down, **kw)(x)
    torch.testing.assert_close(ours, reference_moe(x, router, None, up, down, **kw), rtol=1e-5, atol=1e-5)
