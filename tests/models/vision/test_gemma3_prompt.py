"""A Gemma 3 prompt holding an image, against llama.cpp's mtmd (tests/goldens/vision/gemma3.npz, from
scripts/make_vision_goldens.py): the tiny text model run over the prompt with the image's soft-token rows put
in place of token embeddings (CausalLM embeds=, unscaled) and attended bidirectionally
(AttentionMetadata.bidirectional: llama.cpp decodes a Gemma 3 image non-causally, mtmd_decode_use_non_causal),
then the logits of every text row compared with llama.cpp's.

Criterion (as tests/models/families/test_llama_cpp_logits.py): argmax equal at all rows but one in 40 and the
largest difference within a bound of the largest logit. ggml's fp16 GELU table (text and vision) and fp16
patch convolution keep llama.cpp a few 1e-3 from exact arithmetic (see test_gemma3_vision.py), hence the bound.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.loader import load_model
from hitenter.models.vision.loader import load_vision_encoder
from hitenter.testing.image_prompt_runs import image_prompt_logits, image_span
from hitenter.testing.tiny_gemma import write_tiny_gemma3
from hitenter.testing.tiny_vision import write_tiny_gemma3_mmproj

GOLDEN = Path(__file__).resolve().parents[2] / "goldens" / "vision" / "gemma3.npz"
BS = 16
TOL = 5e-3


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, golden: dict[str, np.ndarray]) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("gemma3_prompt")
    text, mmproj = write_tiny_gemma3(d / "text.gguf", seed=0), write_tiny_gemma3_mmproj(d / "mmproj.gguf", seed=0)
    assert hashlib.sha256(text.read_bytes()).hexdigest() == str(golden["text_sha256"])
    assert hashlib.sha256(mmproj.read_bytes()).hexdigest() == str(golden["mmproj_sha256"])
    return text, mmproj


@pytest.fixture(scope="module")
def model(files: tuple[Path, Path]) -> torch.nn.Module:
    return load_model(files[0], dtype="float32")[0]


def _agreement(ours: torch.Tensor, ref: np.ndarray) -> tuple[int, float]:
    o = ours.double().numpy()
    return int((o.argmax(-1) == ref.argmax(-1)).sum()), float(np.abs(o - ref).max() / np.abs(ref).max())


def _check(ours: torch.Tensor, golden: dict[str, np.ndarray]) -> None:
    tokens, ref = golden["prompt_tokens"], golden["prompt_logits"]
    text_rows = torch.from_numpy(np.flatnonzero(tokens >= 0))
    agree, worst = _agreement(ours[text_rows], ref)
    n = len(ref)
    assert agree >= n - n // 40, f"argmax equal to llama.cpp at only {agree}/{n} text rows"
    assert worst <= TOL, f"max |diff| = {worst:.2e} of max |logit|"


def test_prompt_with_image_matches_llama_cpp(model: torch.nn.Module, files: tuple[Path, Path],
                                             golden: dict[str, np.ndarray]) -> None:
    """End to end: this package's encoder on the image, the decoder on the prompt."""
    enc = load_vision_encoder(files[1])
    embd = enc.encode_image(golden[f"image{int(golden['prompt_image'])}"])
    assert len(golden["prompt_logits"]) >= 40
    _check(image_prompt_logits(model, golden["prompt_tokens"], embd, bidirectional=True), golden)


def test_decoder_on_llama_cpp_embeddings(model: torch.nn.Module, golden: dict[str, np.ndarray]) -> None:
    """The decoder alone: llama.cpp's own image embeddings in, the same logits out."""
    embd = torch.from_numpy(golden["prompt_embd"])
    _check(image_prompt_logits(model, golden["prompt_tokens"], embd, bidirectional=True), golden)


def test_causal_image_does_not_match(model: torch.nn.Module, golden: dict[str, np.ndarray]) -> None:
    """The comparison sees the attention pattern: the image attended causally moves the text rows after it."""
    embd = torch.from_numpy(golden["prompt_embd"])
    tokens, ref = golden["prompt_tokens"], golden["prompt_logits"]
    ours = image_prompt_logits(model, tokens, embd, bidirectional=False)
    _, worst = _agreement(ours[torch.from_numpy(np.flatnonzero(tokens >= 0))], ref)
    assert worst > 10 * TOL


def test_chunked_prefill_gives_the_same_bits(model: torch.nn.Module, golden: dict[str, np.ndarray]) -> None:
    """Steps cut before, around and after the image give every row the bits of one whole-prompt step."""
    tokens = golden["prompt_tokens"]
    s, e = image_span(tokens)
    embd = torch.from_numpy(golden["prompt_embd"])
    whole = image_prompt_logits(model, tokens, embd, bidirectional=True)
    for cuts in ((s,), (s, e), (s - 3, e + 5), (e + 1,)):
        assert torch.equal(image_prompt_logits(model, tokens, embd, bidirectional=True, cuts=cuts), whole), cuts


@torch.inference_mode()
def test_batch_invariance_beside_an_image(model: torch.nn.Module, golden: dict[str, np.ndarray]) -> None:
    """A text-only sequence batched with one holding an image keeps its bits (its rows keep the prompt
    kernel), and the image sequence keeps the bits it has alone."""
    tokens = golden["prompt_tokens"]
    s, e = image_span(tokens)
    embd = torch.from_numpy(golden["prompt_embd"])
    text = [int(t) for t in np.where(tokens < 0, 7, tokens)[:50]]
    alone_text = _text_logits(model, text)
    alone_image = image_prompt_logits(model, tokens, embd, bidirectional=True)
    n = len(tokens)
    per = -(-max(n, len(text)) // BS)
    caches = allocate_kv_caches(model.config, 2 * per, BS)
    ids = torch.tensor(text + [int(t) for t in np.where(tokens < 0, 0, tokens)])
    pos = torch.cat([torch.arange(len(text)), torch.arange(n)])
    slots = torch.cat([torch.arange(len(text)), per * BS + torch.arange(n)])
    meta = AttentionMetadata([0, len(text), len(text) + n], [len(text), n],
                             [list(range(per)), list(range(per, 2 * per))], slots, BS,
                             bidirectional=[[], [(s, e)]])
    embeds = (torch.arange(len(text) + s, len(text) + e), embd)
    both = model.compute_logits(model(ids, pos, meta, caches, embeds=embeds))
    assert torch.equal(both[:len(text)], alone_text)
    assert torch.equal(both[len(text):], alone_image)


@torch.inference_mode()
def _text_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    n = len(ids)
    blocks = -(-n // BS)
    caches = allocate_kv_caches(model.config, blocks, BS)
    meta = AttentionMetadata([0, n], [n], [list(range(blocks))], torch.arange(n), BS)
    return model.compute_logits(model(torch.tensor(ids), torch.arange(n), meta, caches))


def test_a_range_cut_by_the_step_is_refused(model: torch.nn.Module, golden: dict[str, np.ndarray]) -> None:
    tokens = golden["prompt_tokens"]
    s, e = image_span(tokens)
    blocks = -(-len(tokens) // BS)
    caches = allocate_kv_caches(model.config, blocks, BS)
    meta = AttentionMetadata([0, s + 4], [s + 4], [list(range(blocks))], torch.arange(s + 4), BS,
                             bidirectional=[[(s, e)]])
    with pytest.raises(ValueError, match="cut by the step"):
        model(torch.zeros(s + 4, dtype=torch.long), torch.arange(s + 4), meta, caches)
