"""The Gemma 3 vision tower and projector against llama.cpp's mtmd (tests/goldens/vision/gemma3.npz, written
by scripts/make_vision_goldens.py): the same tiny random mmproj, the same RGB pixels, the image embeddings.

llama.cpp rounds two things to fp16 that this implementation keeps in fp32: the patch convolution's inputs
(ggml_conv_2d's im2col is F16 for an F32 kernel, so pixels and kernel meet in fp16) and the GELU (ggml-cpu's
fp16 lookup table). So: in fp32, the embeddings agree to 1e-3 of their range; with those two roundings
copied, to 1e-4 (float rounding: what is left is summation order)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.models.vision.gemma3 import Gemma3Vision
from hitenter.models.vision.mmproj import read_mmproj
from hitenter.models.vision.preprocess import fit_size, fixed_size_pixels
from hitenter.testing.tiny_vision import write_tiny_gemma3_mmproj

GOLDEN = Path(__file__).resolve().parents[2] / "goldens" / "vision" / "gemma3.npz"


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma3_mmproj(tmp_path_factory.mktemp("vision") / "mmproj.gguf", seed=0)


def _images(golden: dict[str, np.ndarray]) -> list[int]:
    return sorted(int(k[5:]) for k in golden if k.startswith("image"))


def _ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml-cpu's GELU: the tanh form looked up at the fp16-rounded input, the result rounded to fp16."""
    y = F.gelu(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def test_golden_is_of_this_writer(golden: dict[str, np.ndarray], mmproj: Path) -> None:
    assert str(golden["mmproj_sha256"]) == hashlib.sha256(mmproj.read_bytes()).hexdigest()
    assert len(_images(golden)) >= 4


def test_embeddings_match_llama_cpp(golden: dict[str, np.ndarray], mmproj: Path) -> None:
    cfg, tensors = read_mmproj(mmproj)
    assert (cfg.projector, cfg.merge, cfg.tokens_per_image, cfg.activation) == ("gemma3", 4, 16, "gelu")
    model = Gemma3Vision(cfg, tensors)
    for i in _images(golden):
        ref = golden[f"embd{i}"]
        got = model(fixed_size_pixels(golden[f"image{i}"], cfg.image_size, cfg.image_mean, cfg.image_std))
        assert got.shape == ref.shape
        err = float(np.abs(got.numpy() - ref).max())
        assert err < 1e-3 * float(np.abs(ref).max()), f"image {i}: max error {err}"


def test_embeddings_match_llama_cpp_with_its_fp16_roundings(golden: dict[str, np.ndarray], mmproj: Path) -> None:
    cfg, tensors = read_mmproj(mmproj)
    model = Gemma3Vision(cfg, tensors)
    model.patch_w = model.patch_w.half().float()
    model.act = _ggml_gelu
    for i in _images(golden):
        ref = golden[f"embd{i}"]
        px = fixed_size_pixels(golden[f"image{i}"], cfg.image_size, cfg.image_mean, cfg.image_std).half().float()
        err = float(np.abs(model(px).numpy() - ref).max())
        assert err < 1e-4, f"image {i}: max error {err}"


def test_one_wrong_pixel_is_seen(golden: dict[str, np.ndarray], mmproj: Path) -> None:
    """The comparison can fail: a single pixel changed by 40 levels moves the embeddings past the bound."""
    cfg, tensors = read_mmproj(mmproj)
    model = Gemma3Vision(cfg, tensors)
    model.patch_w = model.patch_w.half().float()
    model.act = _ggml_gelu
    img = golden["image2"].copy()
    img[10, 10, 0] = (int(img[10, 10, 0]) + 40) % 256
    px = fixed_size_pixels(img, cfg.image_size, cfg.image_mean, cfg.image_std).half().float()
    assert float(np.abs(model(px).numpy() - golden["embd2"]).max()) > 1e-4


def test_fit_size_keeps_the_aspect_ratio() -> None:
    assert fit_size(48, 40, 64) == (64, 54)
    assert fit_size(30, 90, 64) == (22, 64)
    assert fit_size(64, 64, 64) == (64, 64)
    assert fit_size(1, 5000, 896) == (1, 896)


def test_padding_is_black_and_centred(mmproj: Path) -> None:
    cfg, _ = read_mmproj(mmproj)
    white = np.full((90, 30, 3), 255, dtype=np.uint8)
    px = fixed_size_pixels(white, 64, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    cols = px[0].mean(dim=0)
    assert torch.all(cols[:21] == 0) and torch.all(cols[21:43] == 1) and torch.all(cols[43:] == 0)


def test_refusals(tmp_path: Path, mmproj: Path) -> None:
    import gguf

    cfg, tensors = read_mmproj(mmproj)
    with pytest.raises(ModelLoadError, match="v.post_ln.weight"):
        Gemma3Vision(cfg, {k: v for k, v in tensors.items() if k != "v.post_ln.weight"})
    with pytest.raises(ModelLoadError, match="shape"):
        Gemma3Vision(cfg, {**tensors, "v.position_embd.weight": torch.zeros(3, cfg.hidden)})
    with pytest.raises(ValueError, match="pixels"):
        Gemma3Vision(cfg, tensors)(torch.zeros(3, 32, 32))
    other = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(other), "clip")
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("llama4")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ModelLoadError, match="llama4.*not supported"):
        read_mmproj(other)
    with pytest.raises(ModelLoadError, match="not found"):
        read_mmproj(tmp_path / "missing.gguf")
