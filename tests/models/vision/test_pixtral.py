"""The Pixtral vision encoder (with Mistral Small 3.1's patch merger) against llama.cpp's mtmd
(tests/goldens/vision/pixtral.npz, written by scripts/make_dynamic_vision_goldens.py): the image embeddings
of a tiny random mmproj (with the [IMG_BREAK] rows), and a prompt holding an image on the tiny mistral3
text model (tiny_families.py), one position per row, causal.

llama.cpp rounds the patch convolution's inputs and the projector's GELU to fp16 (test_gemma3_vision.py):
in fp32 the embeddings agree to 2e-3 of their range (measured <= 1.0e-3), with those roundings copied to
5e-4 (measured <= 2.7e-4). The prompt: argmax equal at all text rows but one in 40, max difference within
1e-4 of the largest logit on llama.cpp's embeddings, 5e-3 with this package's encoder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.loader import load_model
from hitenter.models.vision.loader import PixtralEncoder, load_vision_encoder
from hitenter.models.vision.mmproj import read_mmproj
from hitenter.models.vision.pixtral import PixtralVision, rope_tables
from hitenter.models.vision.preprocess import dynamic_size_pixels
from hitenter.testing.tiny_families import write_tiny_family
from hitenter.testing.tiny_pixtral import write_tiny_pixtral_mmproj

GOLDEN = Path(__file__).resolve().parents[2] / "goldens" / "vision" / "pixtral.npz"
BS = 16


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, golden: dict) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("pixtral")
    text = write_tiny_family(d / "text.gguf", "mistral3", seed=0)
    mmproj = write_tiny_pixtral_mmproj(d / "mmproj.gguf", seed=0)
    assert hashlib.sha256(mmproj.read_bytes()).hexdigest() == str(golden["mmproj_sha256"])
    assert hashlib.sha256(text.read_bytes()).hexdigest() == str(golden["text_sha256"])
    return text, mmproj


def _pixels(cfg, rgb: np.ndarray) -> torch.Tensor:
    return dynamic_size_pixels(rgb, cfg.patch_size * cfg.merge, *cfg.pixel_limits, cfg.image_mean, cfg.image_std)


def _ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    y = F.gelu(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def _max_rel(got: torch.Tensor, ref: np.ndarray) -> float:
    assert tuple(got.shape) == ref.shape
    return float(np.abs(got.numpy() - ref).max() / np.abs(ref).max())


def _images(golden: dict) -> list[int]:
    return sorted(int(k[5:]) for k in golden if k.startswith("image"))


def test_embeddings_match_llama_cpp(files: tuple[Path, Path], golden: dict) -> None:
    cfg, tensors = read_mmproj(files[1])
    assert (cfg.projector, cfg.merge, cfg.activation) == ("pixtral", 2, "silu")
    model = PixtralVision(cfg, tensors)
    for i in _images(golden):
        err = _max_rel(model(_pixels(cfg, golden[f"image{i}"])), golden[f"embd{i}"])
        assert err < 2e-3, f"image {i}: max error {err:.2e} of the range"


@pytest.mark.slow
def test_embeddings_match_llama_cpp_with_its_fp16_roundings(files: tuple[Path, Path], golden: dict) -> None:
    cfg, tensors = read_mmproj(files[1])
    model = PixtralVision(cfg, tensors)
    model.patch_w, model.merger_act = model.patch_w.half().float(), _ggml_gelu
    for i in _images(golden):
        err = _max_rel(model(_pixels(cfg, golden[f"image{i}"]).half().float()), golden[f"embd{i}"])
        assert err < 5e-4, f"image {i}: max error {err:.2e} of the range"


def test_break_rows_and_interface(files: tuple[Path, Path], golden: dict) -> None:
    enc = load_vision_encoder(files[1])
    assert isinstance(enc, PixtralEncoder) and not enc.mrope and not enc.bidirectional
    assert (enc.image_begin, enc.image_end) == ("", "[IMG_END]")
    image = enc.prepare(golden["image1"])   # 100 x 70 -> 96 x 64: 4 rows x 6 columns of tokens
    assert tuple(image.pixels.shape) == (3, 64, 96) and image.num_tokens == 4 * 6 + 3
    out = enc.encode(image)
    brk = enc.tower.img_break
    assert all(torch.equal(out[r * 7 + 6], brk) for r in range(3)) and out.shape[0] == 27


def test_rope_halves() -> None:
    """ggml's rope_2d: pair m < d/4 turns by the row at 10000^(-4m/d); pair d/4 + j by the column at
    10000^(-(4j + 2)/d)."""
    cos, _ = rope_tables(torch.tensor([3]), torch.tensor([5]), 16)
    angles = torch.acos(cos[0].double().clamp(-1, 1))
    want = [3 * 10000 ** (-4 * m / 16) for m in range(4)] + [5 * 10000 ** (-(4 * j + 2) / 16) for j in range(4)]
    want = torch.tensor(want, dtype=torch.float64)
    folded = torch.acos(torch.cos(want))
    assert torch.allclose(angles, folded, atol=1e-5)


def test_refusals(files: tuple[Path, Path]) -> None:
    cfg, tensors = read_mmproj(files[1])
    with pytest.raises(ModelLoadError, match="patch_merger"):
        PixtralVision(cfg, {k: v for k, v in tensors.items() if k != "mm.patch_merger.weight"})
    with pytest.raises(ModelLoadError, match="img_break"):
        PixtralVision(cfg, {k: v for k, v in tensors.items() if k != "v.token_embd.img_break"})
    with pytest.raises(ValueError, match="multiples of 16"):
        PixtralVision(cfg, tensors)(torch.zeros(3, 48, 40))


@torch.inference_mode()
def _logits(model: torch.nn.Module, tokens: np.ndarray, embd: torch.Tensor) -> torch.Tensor:
    n = len(tokens)
    rows = np.flatnonzero(tokens < 0)
    s, e = int(rows[0]), int(rows[-1]) + 1
    blocks = -(-n // BS)
    caches = allocate_kv_caches(model.config, blocks, BS)
    meta = AttentionMetadata([0, n], [n], [list(range(blocks))], torch.arange(n), BS)
    ids = torch.tensor(np.where(tokens < 0, 0, tokens))
    return model.compute_logits(model(ids, torch.arange(n), meta, caches, embeds=(torch.arange(s, e), embd)))


def _check(ours: torch.Tensor, golden: dict, tol: float) -> None:
    tokens, ref = golden["prompt_tokens"], golden["prompt_logits"]
    o = ours[torch.from_numpy(np.flatnonzero(tokens >= 0))].double().numpy()
    n, agree = len(ref), int((o.argmax(-1) == ref.argmax(-1)).sum())
    worst = float(np.abs(o - ref).max() / np.abs(ref).max())
    assert n >= 40 and agree >= n - n // 40, f"argmax equal to llama.cpp at only {agree}/{n} text rows"
    assert worst <= tol, f"max |diff| = {worst:.2e} of max |logit|"


def test_prompt_matches_llama_cpp(files: tuple[Path, Path], golden: dict) -> None:
    model = load_model(files[0], dtype="float32")[0]
    assert np.array_equal(golden["prompt_pos"], np.arange(len(golden["prompt_tokens"])))
    _check(_logits(model, golden["prompt_tokens"], torch.from_numpy(golden["prompt_embd"])), golden, 1e-4)
    enc = load_vision_encoder(files[1])
    embd = enc.encode_image(golden[f"image{int(golden['prompt_image'])}"])
    _check(_logits(model, golden["prompt_tokens"], embd), golden, 5e-3)
