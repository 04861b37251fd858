"""A Qwen2.5-VL / Qwen2-VL / Qwen3-VL prompt holding an image, against llama.cpp's mtmd (tests/goldens/
vision/qwen25vl.npz, qwen2vl.npz, qwen3vl.npz, qwen3vlmoe.npz: the Qwen3-VL mmproj before an MoE text
model; from scripts/make_dynamic_vision_goldens.py): the tiny text model (qwen2vl: M-RoPE; qwen3vl /
qwen3vlmoe: interleaved M-RoPE + DeepStack) run over the prompt with the image's rows put in place of token
embeddings (CausalLM embeds=) at M-RoPE positions (models/mrope.py: the image's rows at (p0, p0 + row,
p0 + column), the text after it from p0 + max(rows, columns)), causal as llama.cpp decodes a Qwen image,
then the logits of every text row compared with llama.cpp's.

Criterion: argmax equal at all rows but one in 40 and the largest difference within a bound of the largest
logit: 1e-4 on llama.cpp's own embeddings (measured <= 7e-6), 5e-3 with this package's encoder (measured
3e-4: the encoder's fp16 differences, test_qwen_vision.py)."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.models import mrope
from hitenter.models.loader import load_model
from hitenter.models.vision.loader import load_vision_encoder
from hitenter.testing.image_prompt_runs import image_prompt_logits, image_span
from hitenter.testing.tiny_qwen_vision import (
    write_tiny_qwen2vl_mmproj,
    write_tiny_qwen3vl_mmproj,
    write_tiny_qwen25vl_mmproj,
    write_tiny_qwen_vl_text,
)

GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "vision"
FAMILIES = {"qwen25vl": ("qwen2vl", write_tiny_qwen25vl_mmproj), "qwen2vl": ("qwen2vl", write_tiny_qwen2vl_mmproj),
            "qwen3vl": ("qwen3vl", write_tiny_qwen3vl_mmproj), "qwen3vlmoe": ("qwen3vlmoe", write_tiny_qwen3vl_mmproj)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    name = request.param
    arch, writer = FAMILIES[name]
    with np.load(GOLDENS / f"{name}.npz") as z:
        golden = {k: z[k] for k in z.files}
    d = tmp_path_factory.mktemp(name)
    text, mmproj = write_tiny_qwen_vl_text(d / "text.gguf", arch, seed=0), writer(d / "mmproj.gguf", seed=0)
    assert hashlib.sha256(text.read_bytes()).hexdigest() == str(golden["text_sha256"])
    return {"name": name, "golden": golden, "mmproj": mmproj, "model": load_model(text, dtype="float32")[0]}


def _positions(tokens: np.ndarray, grid: tuple[int, int]) -> torch.Tensor:
    s, e = image_span(tokens)
    return torch.cat([mrope.text_positions(0, s), mrope.image_positions(s, *grid),
                      mrope.text_positions(mrope.after_image(s, *grid), len(tokens) - e)])


def _agreement(ours: torch.Tensor, golden: dict) -> tuple[int, int, float]:
    tokens, ref = golden["prompt_tokens"], golden["prompt_logits"]
    o = ours[torch.from_numpy(np.flatnonzero(tokens >= 0))].double().numpy()
    return int((o.argmax(-1) == ref.argmax(-1)).sum()), len(ref), float(np.abs(o - ref).max() / np.abs(ref).max())


def _check(ours: torch.Tensor, golden: dict, tol: float) -> None:
    agree, n, worst = _agreement(ours, golden)
    assert n >= 40
    assert agree >= n - n // 40, f"argmax equal to llama.cpp at only {agree}/{n} text rows"
    assert worst <= tol, f"max |diff| = {worst:.2e} of max |logit|"


def test_positions_are_llama_cpps(case: dict) -> None:
    g = case["golden"]
    pos = _positions(g["prompt_tokens"], tuple(g["prompt_grid"]))
    assert np.array_equal(pos[:, 0].numpy(), g["prompt_pos"])


def test_decoder_on_llama_cpp_embeddings(case: dict) -> None:
    g = case["golden"]
    pos = _positions(g["prompt_tokens"], tuple(g["prompt_grid"]))
    _check(image_prompt_logits(case["model"], g["prompt_tokens"], torch.from_numpy(g["prompt_embd"]), pos), g, 1e-4)


def test_prompt_with_image_matches_llama_cpp(case: dict) -> None:
    """End to end: this package's encoder on the image, its grid, the decoder on the prompt."""
    g = case["golden"]
    enc = load_vision_encoder(case["mmproj"])
    image = enc.prepare(g[f"image{int(g['prompt_image'])}"])
    assert image.grid == tuple(int(v) for v in g["prompt_grid"])
    embd = enc.encode(image)
    pos = _positions(g["prompt_tokens"], image.grid)
    _check(image_prompt_logits(case["model"], g["prompt_tokens"], embd, pos), g, 5e-3)


def test_one_axis_positions_do_not_match(case: dict) -> None:
    """The comparison sees M-RoPE: the same prompt at positions 0..N-1 on every axis misses by far."""
    g = case["golden"]
    pos = mrope.text_positions(0, len(g["prompt_tokens"]))
    ours = image_prompt_logits(case["model"], g["prompt_tokens"], torch.from_numpy(g["prompt_embd"]), pos)
    assert _agreement(ours, g)[2] > 100 * 1e-4


def test_deepstack_is_added(case: dict) -> None:
    """Qwen3-VL: the image's DeepStack blocks zeroed move the text rows after the image past the bound."""
    g = case["golden"]
    if not case["name"].startswith("qwen3vl"):
        pytest.skip("DeepStack is Qwen3-VL's")
    embd = torch.from_numpy(g["prompt_embd"]).clone()
    embd[:, case["model"].config.hidden_size:] = 0
    pos = _positions(g["prompt_tokens"], tuple(g["prompt_grid"]))
    assert _agreement(image_prompt_logits(case["model"], g["prompt_tokens"], embd, pos), g)[2] > 100 * 1e-4


@pytest.mark.slow
def test_chunked_prefill_gives_the_same_bits(case: dict) -> None:
    g = case["golden"]
    tokens = g["prompt_tokens"]
    s, e = image_span(tokens)
    pos = _positions(tokens, tuple(g["prompt_grid"]))
    embd = torch.from_numpy(g["prompt_embd"])
    whole = image_prompt_logits(case["model"], tokens, embd, pos)
    for cuts in ((s,), (s, e), (s - 3, e + 5)):
        assert torch.equal(image_prompt_logits(case["model"], tokens, embd, pos, cuts=cuts), whole), cuts


def test_text_rows_take_the_same_table_either_way(case: dict) -> None:
    """A text row's cos / sin from a [T] position equal those from its (p, p, p, 0) row."""
    rope = case["model"].rope
    p = torch.arange(0, 300, 7)
    one, four = rope.table(p, torch.float32), rope.table(mrope.text_positions_of(p), torch.float32)
    assert torch.equal(one[0], four[0]) and torch.equal(one[1], four[1])


def test_sequence_positions_for_any_cut(case: dict) -> None:
    """sequence_positions (what a runner asks for a step's rows) gives llama.cpp's positions whole, and the
    same rows for any cut, generated rows after the prompt included."""
    g = case["golden"]
    tokens = g["prompt_tokens"]
    s, _ = image_span(tokens)
    images = [(s, *(int(v) for v in g["prompt_grid"]))]
    n = len(tokens)
    whole = mrope.sequence_positions(0, n + 3, images)
    assert torch.equal(whole[:n], _positions(tokens, images[0][1:]))
    cuts = (0, 5, s + 3, n - 2, n + 3)
    parts = torch.cat([mrope.sequence_positions(a, b, images) for a, b in itertools.pairwise(cuts)])
    assert torch.equal(parts, whole)
    assert whole[n:, 0].tolist() == [int(whole[n - 1, 0]) + k for k in (1, 2, 3)]


def test_sequence_positions_with_two_images() -> None:
    """Worked by hand from mtmd's rule: text at 0; a 2 x 2 image from row 1 at t = 1 (rows 1-2, columns
    1-2), the text after it at 1 + 2 = 3; a 1 x 3 image from row 6 at t = 4, the text after it at 7."""
    got = mrope.sequence_positions(0, 11, [(6, 1, 3), (1, 2, 2)]).tolist()
    assert got == [[0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 2, 0], [1, 2, 1, 0], [1, 2, 2, 0], [3, 3, 3, 0],
                   [4, 4, 4, 0], [4, 4, 5, 0], [4, 4, 6, 0], [7, 7, 7, 0], [8, 8, 8, 0]]


def test_image_rows_with_one_axis_positions_are_refused(case: dict) -> None:
    g = case["golden"]
    n = len(g["prompt_tokens"])
    with pytest.raises(ValueError, match=r"\[T, 4\] positions"):
        image_prompt_logits(case["model"], g["prompt_tokens"], torch.from_numpy(g["prompt_embd"]), torch.arange(n))
