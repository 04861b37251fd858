"""find_mmproj: the mmproj beside a model is found when it fits the model, and only then."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hitenter.errors import ModelLoadError
from hitenter.models.vision.discovery import check_mmproj_fits, find_mmproj, read_mmproj_config
from hitenter.models.vision.loader import load_vision_encoder
from hitenter.testing.tiny_vision import sample_image, write_tiny_gemma3_mmproj


def test_found_only_when_it_fits(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"not read")
    assert find_mmproj(model, "gemma3", 64) is None
    mm = write_tiny_gemma3_mmproj(tmp_path / "mmproj-tiny-f32.gguf", text_hidden=64)
    assert find_mmproj(model, "gemma3", 64) == mm
    assert find_mmproj(model, "llama", 64) is None        # another family's model in the same folder
    assert find_mmproj(model, "gemma3", 640) is None      # another width
    (tmp_path / "mmproj-broken.gguf").write_bytes(b"GGUF\x03\x00")   # unreadable files are passed over
    assert find_mmproj(model, "gemma3", 64) == mm
    write_tiny_gemma3_mmproj(tmp_path / "mmproj-tiny-2.gguf", text_hidden=64, seed=1)
    with pytest.raises(ModelLoadError, match="several mmproj files.*--mmproj"):
        find_mmproj(model, "gemma3", 64)


def test_named_file_must_fit(tmp_path: Path) -> None:
    mm = write_tiny_gemma3_mmproj(tmp_path / "mmproj.gguf", text_hidden=64)
    cfg = read_mmproj_config(mm)
    check_mmproj_fits(cfg, mm, "gemma3", 64)
    with pytest.raises(ModelLoadError, match="does not fit a qwen2 text model"):
        check_mmproj_fits(cfg, mm, "qwen2", 64)
    with pytest.raises(ModelLoadError, match="output width 64 is not the text model's hidden size 32"):
        check_mmproj_fits(cfg, mm, "gemma3", 32)


def test_encoder_from_file(tmp_path: Path) -> None:
    enc = load_vision_encoder(write_tiny_gemma3_mmproj(tmp_path / "mmproj.gguf"))
    out = enc.encode_image(sample_image(20, 30, 1))
    assert out.shape == (16, 64) and bool(np.isfinite(out.numpy()).all())
