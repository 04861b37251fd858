"""The Qwen2.5-VL, Qwen2-VL and Qwen3-VL vision encoders against llama.cpp's mtmd (tests/goldens/vision/
qwen25vl.npz, qwen2vl.npz, qwen3vl.npz, written by scripts/make_dynamic_vision_goldens.py): the same tiny
random mmproj, the same RGB pixels, the image embeddings (Qwen3-VL's with their DeepStack blocks).

llama.cpp rounds to fp16 what this implementation keeps in fp32: the patch convolutions' inputs (im2col
F16) and the GELU (ggml-cpu's fp16 tables; the mergers', Qwen3-VL's MLP, Qwen2-VL's quick GELU). These tiny
random towers are sensitive: this implementation in fp32 and in fp64 differ by ~3e-4 of the range. So: in
fp32 the embeddings agree to 1e-3 of their range; with those roundings copied, to 5e-4 (measured <= 2.8e-4)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.models.vision import qwen_vit
from hitenter.models.vision.discovery import find_mmproj
from hitenter.models.vision.loader import QwenVLEncoder, load_vision_encoder
from hitenter.models.vision.mmproj import read_mmproj
from hitenter.models.vision.preprocess import dynamic_size_pixels, smart_size
from hitenter.models.vision.qwen3vl import Qwen3VLVision, interpolate_align_corners
from hitenter.models.vision.qwen25vl import QwenVLVision, windows
from hitenter.testing.tiny_qwen_vision import (
    write_tiny_qwen2vl_mmproj,
    write_tiny_qwen3vl_mmproj,
    write_tiny_qwen25vl_mmproj,
)

GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "vision"
FAMILIES = {"qwen25vl": (write_tiny_qwen25vl_mmproj, QwenVLVision),
            "qwen2vl": (write_tiny_qwen2vl_mmproj, QwenVLVision),
            "qwen3vl": (write_tiny_qwen3vl_mmproj, Qwen3VLVision)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict]:
    name = request.param
    with np.load(GOLDENS / f"{name}.npz") as z:
        golden = {k: z[k] for k in z.files}
    path = FAMILIES[name][0](tmp_path_factory.mktemp(name) / "mmproj-tiny.gguf", seed=0)
    return name, path, golden


def _images(golden: dict) -> list[int]:
    return sorted(int(k[5:]) for k in golden if k.startswith("image"))


def _pixels(cfg, rgb: np.ndarray) -> torch.Tensor:
    return dynamic_size_pixels(rgb, cfg.patch_size * cfg.merge, *cfg.pixel_limits, cfg.image_mean, cfg.image_std)


def _ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml-cpu's GELU: the tanh form looked up at the fp16-rounded input, the result rounded to fp16."""
    y = F.gelu(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def _ggml_gelu_quick(x: torch.Tensor) -> torch.Tensor:
    """ggml-cpu's quick GELU: looked up at the fp16-rounded input, the result rounded to fp16."""
    xh = x.half().float()
    return (xh * torch.sigmoid(1.702 * xh)).half().float()


def _with_ggml_roundings(model: torch.nn.Module) -> torch.nn.Module:
    model.patch_w = tuple(w.half().float() for w in model.patch_w)
    model.merger_act = _ggml_gelu
    model.act = {"gelu": _ggml_gelu, "gelu_quick": _ggml_gelu_quick}.get(model.cfg.activation, model.act)
    return model


def _max_rel(got: torch.Tensor, ref: np.ndarray) -> float:
    assert tuple(got.shape) == ref.shape
    return float(np.abs(got.numpy() - ref).max() / np.abs(ref).max())


def test_golden_is_of_this_writer(family: tuple[str, Path, dict]) -> None:
    _, path, golden = family
    assert str(golden["mmproj_sha256"]) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(_images(golden)) >= 3


def test_embeddings_match_llama_cpp(family: tuple[str, Path, dict]) -> None:
    name, path, golden = family
    cfg, tensors = read_mmproj(path)
    model = FAMILIES[name][1](cfg, tensors)
    for i in _images(golden):
        err = _max_rel(model(_pixels(cfg, golden[f"image{i}"])), golden[f"embd{i}"])
        assert err < 1e-3, f"{name} image {i}: max error {err:.2e} of the range"


@pytest.mark.slow
def test_embeddings_match_llama_cpp_with_its_fp16_roundings(family: tuple[str, Path, dict]) -> None:
    name, path, golden = family
    cfg, tensors = read_mmproj(path)
    model = _with_ggml_roundings(FAMILIES[name][1](cfg, tensors))
    for i in _images(golden):
        err = _max_rel(model(_pixels(cfg, golden[f"image{i}"]).half().float()), golden[f"embd{i}"])
        assert err < 5e-4, f"{name} image {i}: max error {err:.2e} of the range"


def test_one_wrong_pixel_is_seen(family: tuple[str, Path, dict]) -> None:
    name, path, golden = family
    cfg, tensors = read_mmproj(path)
    model = _with_ggml_roundings(FAMILIES[name][1](cfg, tensors))
    img = golden["image1"].copy()
    img[100, 150, 0] = (int(img[100, 150, 0]) + 60) % 256
    assert _max_rel(model(_pixels(cfg, img).half().float()), golden["embd1"]) > 2e-3


@pytest.mark.slow
def test_window_attention_is_what_llama_cpp_runs(tmp_path: Path) -> None:
    """Qwen2.5-VL with every layer attending fully misses llama.cpp's embeddings of an image holding
    several windows by far more than the bound."""
    with np.load(GOLDENS / "qwen25vl.npz") as z:
        img, ref = z["image1"], z["embd1"]
    cfg, tensors = read_mmproj(write_tiny_qwen25vl_mmproj(tmp_path / "m.gguf", seed=0))
    full = QwenVLVision(dataclasses.replace(cfg, n_wa_pattern=0), tensors)
    assert _max_rel(full(_pixels(cfg, img)), ref) > 1e-2


def test_deepstack_blocks_are_in_the_output(tmp_path: Path) -> None:
    with np.load(GOLDENS / "qwen3vl.npz") as z:
        ref = z["embd0"]
    cfg, tensors = read_mmproj(write_tiny_qwen3vl_mmproj(tmp_path / "m.gguf", seed=0))
    model = Qwen3VLVision(cfg, tensors)
    width = 3 * cfg.projection_dim
    assert (model.deepstack_count, model.output_width, ref.shape[1]) == (2, width, width)
    blocks = ref.reshape(ref.shape[0], 3, -1)
    assert np.abs(blocks[:, 1] - blocks[:, 2]).max() > 0.1 and np.abs(blocks[:, 0] - blocks[:, 1]).max() > 0.1


def test_smart_size() -> None:
    """clip.cpp's calc_size_preserved_ratio, worked by hand: round to the alignment; under the minimum,
    scale up by sqrt(min / area) and ceil; over the maximum, scale down by sqrt(area / max) and floor."""
    lo, hi = 8 * 28 * 28, 4096 * 28 * 28
    assert smart_size(300, 200, 28, lo, hi) == (308, 196)
    assert smart_size(48, 40, 28, lo, hi) == (112, 84)        # 56 x 28 < 6272: x sqrt(6272 / 1920)
    assert smart_size(5000, 4000, 28, lo, hi) == (1988, 1596)  # / sqrt(2e7 / 3211264) = 2.4956
    assert smart_size(1, 1, 28, lo, hi) == (84, 84)            # x sqrt(6272) = 79.2 -> 3 x 28
    assert smart_size(42, 42, 28, 0, 0) == (56, 56)            # 1.5 rounds away from zero


def test_dynamic_pixels_keep_the_aspect_and_pad_black() -> None:
    white = np.full((90, 30, 3), 255, dtype=np.uint8)
    px = dynamic_size_pixels(white, 32, 8 * 32 * 32, 4096 * 32 * 32, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    assert tuple(px.shape) == (3, 160, 64)   # 30 x 90 -> 32 x 96 < 8192 -> x 1.749: 64 x 160
    cols = px[0].mean(dim=0)
    assert torch.all(cols[:4] == 0) and torch.all(cols[-4:] == 0) and float(cols[32]) == pytest.approx(1.0)


def test_position_table_resize_is_bilinear_align_corners() -> None:
    """ggml_interpolate (bilinear, align corners) against torch's own F.interpolate."""
    table = torch.randn(36, 5)
    got = interpolate_align_corners(table, 6, 9, 4)
    ref = F.interpolate(table.T.reshape(1, 5, 6, 6), size=(9, 4), mode="bilinear", align_corners=True)
    assert torch.allclose(got, ref[0].reshape(5, -1).T, atol=1e-6)
    assert interpolate_align_corners(table, 6, 6, 6) is table


def test_merge_order_and_windows() -> None:
    assert qwen_vit.merge_order(2, 4).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    order, wid = windows(3, 5, 2)   # windows of 2 x 2 units, cut at the grid's edge
    assert order.tolist() == [0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14]
    assert wid.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5]


def test_encoder_interface(family: tuple[str, Path, dict]) -> None:
    name, path, golden = family
    enc = load_vision_encoder(path)
    assert isinstance(enc, QwenVLEncoder) and enc.mrope and not enc.bidirectional
    assert (enc.image_begin, enc.image_end) == ("<|vision_start|>", "<|vision_end|>")
    image = enc.prepare(golden["image1"])
    rows, cols = image.grid
    out = enc.encode(image)
    assert image.num_tokens == rows * cols == out.shape[0] and out.shape[1] == enc.output_width
    assert enc.content_key(enc.prepare(golden["image1"])) == enc.content_key(image)


def test_find_mmproj_fits_the_text_arch(family: tuple[str, Path, dict]) -> None:
    name, path, _ = family
    model = path.parent / "model.gguf"
    arch = "qwen3vl" if name == "qwen3vl" else "qwen2vl"
    assert find_mmproj(model, arch, 64) == path
    assert find_mmproj(model, "gemma3", 64) is None and find_mmproj(model, arch, 32) is None


def test_refusals(tmp_path: Path) -> None:
    import gguf

    cfg, tensors = read_mmproj(write_tiny_qwen25vl_mmproj(tmp_path / "a.gguf", seed=0))
    with pytest.raises(ModelLoadError, match="v.patch_embd.weight.1"):
        QwenVLVision(cfg, {k: v for k, v in tensors.items() if k != "v.patch_embd.weight.1"})
    with pytest.raises(ValueError, match="multiples of 28"):
        QwenVLVision(cfg, tensors)(torch.zeros(3, 56, 70))
    cfg3, tensors3 = read_mmproj(write_tiny_qwen3vl_mmproj(tmp_path / "b.gguf", seed=0))
    with pytest.raises(ModelLoadError, match="position_embd"):
        Qwen3VLVision(cfg3, {**tensors3, "v.position_embd.weight": torch.zeros(35, cfg3.hidden)})
    bad = tmp_path / "c.gguf"
    w = gguf.GGUFWriter(str(bad), "clip")
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("qwen2.5vl_merger")
    for key, value in (("image_size", 56), ("patch_size", 14), ("embedding_length", 32), ("feed_forward_length", 48),
                       ("block_count", 1), ("projection_dim", 64)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_uint32("clip.vision.attention.head_count", 2)
    w.add_array("clip.vision.image_mean", [0.5] * 3)
    w.add_array("clip.vision.image_std", [0.5] * 3)
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ModelLoadError, match="n_wa_pattern"):
        read_mmproj(bad)
