"""load_vision_encoder(path) -> the vision tower + projector of an mmproj file, by its projector type.

Contract: the returned module maps one image's preprocessed pixels to its soft-token rows
(`encoder(encoder.preprocess(rgb))` -> [tokens_per_image, projection_dim]); ModelLoadError for a file that
cannot be run (mmproj.py, the tower's tensor checks)."""

from __future__ import annotations

import os

import numpy as np
import torch

from hitenter.models.vision.gemma3 import Gemma3Vision
from hitenter.models.vision.mmproj import read_mmproj
from hitenter.models.vision.preprocess import fixed_size_pixels


class VisionEncoder:
    """An mmproj's tower with its family's preprocessing."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.config, tensors = read_mmproj(path)
        self.tower = Gemma3Vision(self.config, tensors)   # the one projector mmproj.py accepts

    def preprocess(self, rgb: np.ndarray) -> torch.Tensor:
        cfg = self.config
        return fixed_size_pixels(rgb, cfg.image_size, cfg.image_mean, cfg.image_std)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.tower(pixels)

    def encode_image(self, rgb: np.ndarray) -> torch.Tensor:
        """[H, W, 3] uint8 RGB -> [tokens_per_image, projection_dim] float32."""
        return self(self.preprocess(rgb))


def load_vision_encoder(path: str | os.PathLike[str]) -> VisionEncoder:
    return VisionEncoder(path)
