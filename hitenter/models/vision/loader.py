"""load_vision_encoder(path) -> the vision encoder of an mmproj file, by its projector type (ENCODERS).

Contract (what the engine relies on, for every family):
- ``encoder.prepare(rgb [H, W, 3] uint8) -> ImageInput``: the encoder's input (preprocessed pixels) and how
  many soft-token rows the image takes in the text sequence; a pure function of the pixels.
- ``encoder.encode(image_input) -> [image_input.num_tokens, output_width]`` float32: the rows the text model
  takes in place of the image's soft tokens (CausalLM embeds=); output_width is projection_dim, or for
  Qwen3-VL projection_dim x (1 + DeepStack blocks) (the text model's n_embd_inp, models/deepstack.py).
- ``mrope``: whether the text model places the image's rows by M-RoPE (Qwen-VL): then
  ``image_input.grid`` = (rows, columns) of its token grid, and the rows' positions and the text's after
  them come from hitenter/models/mrope.py (image_positions, after_image).
- ``image_begin`` / ``image_end``: the text llama.cpp's mtmd puts before and after an image's rows (tokenized
  as text with special tokens parsed, each on its own); ``bidirectional``: whether the text model attends
  an image's rows to each other both ways (Gemma 3; Gemma 4 on its sliding-window layers).
- ``content_key(image_input)``: a digest of the encoder's input, the key the encoder cache and the prefix
  cache know the image by.
ModelLoadError for a file that cannot be run (mmproj.py, the tower's tensor checks). A new family plugs in
as a VisionEncoder subclass registered in ENCODERS under its clip.projector_type.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch

from hitenter.errors import ModelLoadError
from hitenter.models.vision.gemma3 import Gemma3Vision
from hitenter.models.vision.gemma4v import Gemma4Vision
from hitenter.models.vision.mmproj import MmprojConfig, read_mmproj
from hitenter.models.vision.pixtral import PixtralVision
from hitenter.models.vision.preprocess import dynamic_size_pixels, fixed_size_pixels
from hitenter.models.vision.qwen3vl import Qwen3VLVision
from hitenter.models.vision.qwen25vl import QwenVLVision


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image as its encoder takes it: `pixels` (the family's layout) and its soft-token count."""

    pixels: torch.Tensor
    num_tokens: int
    grid: tuple[int, int] | None = None   # (rows, columns) of the token grid (M-RoPE families)


class VisionEncoder:
    """The interface the engine uses (see the module contract); a family overrides prepare / encode."""

    image_begin: str = ""
    image_end: str = ""
    bidirectional: bool = False
    mrope: bool = False

    def __init__(self, config: MmprojConfig) -> None:
        self.config = config

    @property
    def projection_dim(self) -> int:
        return self.config.projection_dim

    @property
    def output_width(self) -> int:
        return self.config.projection_dim

    def prepare(self, rgb: np.ndarray) -> ImageInput:
        raise NotImplementedError

    def encode(self, image: ImageInput) -> torch.Tensor:
        raise NotImplementedError

    def content_key(self, image: ImageInput) -> bytes:
        """BLAKE2b-16 of the pixels' dtype, shape and bytes (the same image prepared twice gives one key)."""
        t = image.pixels.detach().contiguous().cpu()
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
        return h.digest()

    def encode_image(self, rgb: np.ndarray) -> torch.Tensor:
        """[H, W, 3] uint8 RGB -> [tokens, projection_dim] float32."""
        return self.encode(self.prepare(rgb))


class Gemma3Encoder(VisionEncoder):
    """Gemma 3: SigLIP tower + projector on a fixed-size image (gemma3.py), `<start_of_image>` rows
    `<end_of_image>` (mtmd.cpp PROJECTOR_TYPE_GEMMA3), attended bidirectionally by the text model."""

    image_begin = "<start_of_image>"
    image_end = "<end_of_image>"
    bidirectional = True

    def __init__(self, config: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(config)
        self.tower = Gemma3Vision(config, tensors)

    def preprocess(self, rgb: np.ndarray) -> torch.Tensor:
        cfg = self.config
        return fixed_size_pixels(rgb, cfg.image_size, cfg.image_mean, cfg.image_std)

    def prepare(self, rgb: np.ndarray) -> ImageInput:
        return ImageInput(self.preprocess(rgb), self.config.tokens_per_image)

    def encode(self, image: ImageInput) -> torch.Tensor:
        return self.tower(image.pixels)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.tower(pixels)


class QwenVLEncoder(VisionEncoder):
    """Qwen2-VL / Qwen2.5-VL (qwen25vl.py) and Qwen3-VL (qwen3vl.py): the image resized to its own size in
    multiples of patch x 2 (preprocess.py dynamic_size_pixels), `<|vision_start|>` rows `<|vision_end|>`
    (mtmd.cpp PROJECTOR_TYPE_QWEN*VL), causal, placed by M-RoPE over its token grid."""

    image_begin = "<|vision_start|>"
    image_end = "<|vision_end|>"
    mrope = True

    def __init__(self, config: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(config)
        self.tower = Qwen3VLVision(config, tensors) if config.projector == "qwen3vl_merger" \
            else QwenVLVision(config, tensors)

    @property
    def output_width(self) -> int:
        return getattr(self.tower, "output_width", self.config.projection_dim)

    def preprocess(self, rgb: np.ndarray) -> torch.Tensor:
        cfg = self.config
        return dynamic_size_pixels(rgb, cfg.patch_size * cfg.merge, *cfg.pixel_limits, cfg.image_mean, cfg.image_std)

    def prepare(self, rgb: np.ndarray) -> ImageInput:
        pixels = self.preprocess(rgb)
        side = self.config.patch_size * self.config.merge
        rows, cols = pixels.shape[1] // side, pixels.shape[2] // side
        return ImageInput(pixels, rows * cols, (rows, cols))

    def encode(self, image: ImageInput) -> torch.Tensor:
        return self.tower(image.pixels)


class PixtralEncoder(VisionEncoder):
    """Pixtral / Mistral Small 3.1 / Ministral 3 (pixtral.py): the image resized to its own size in multiples
    of patch x merge (preprocess.py dynamic_size_pixels), its rows (an [IMG_BREAK] row after each token
    row but the last) then `[IMG_END]` (mtmd.cpp PROJECTOR_TYPE_PIXTRAL), causal, one position per row."""

    image_end = "[IMG_END]"

    def __init__(self, config: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(config)
        self.tower = PixtralVision(config, tensors)

    def preprocess(self, rgb: np.ndarray) -> torch.Tensor:
        cfg = self.config
        return dynamic_size_pixels(rgb, cfg.patch_size * cfg.merge, *cfg.pixel_limits, cfg.image_mean, cfg.image_std)

    def prepare(self, rgb: np.ndarray) -> ImageInput:
        pixels = self.preprocess(rgb)
        side = self.config.patch_size * self.config.merge
        rows, cols = pixels.shape[1] // side, pixels.shape[2] // side
        return ImageInput(pixels, rows * cols + rows - 1)

    def encode(self, image: ImageInput) -> torch.Tensor:
        return self.tower(image.pixels)


class Gemma4Encoder(VisionEncoder):
    """Gemma 4 (gemma4v.py): the image resized to its own size in multiples of patch x merge within 70..1120
    tokens (preprocess.py dynamic_size_pixels), `<|image>` rows `<image|>` (mtmd.cpp PROJECTOR_TYPE_GEMMA4V),
    one position per row. Attended bidirectionally (the text model's sliding-window layers only, llama.cpp's
    LLAMA_NON_CAUSAL_TYPE_SWA_ONLY) unless the text width is E2B's 1536 or E4B's 2560, which mtmd decodes
    causally (mtmd_decode_use_non_causal)."""

    image_begin = "<|image>"
    image_end = "<image|>"
    CAUSAL_WIDTHS = (1536, 2560)

    def __init__(self, config: MmprojConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(config)
        self.tower = Gemma4Vision(config, tensors)
        self.bidirectional = config.projection_dim not in self.CAUSAL_WIDTHS

    def preprocess(self, rgb: np.ndarray) -> torch.Tensor:
        cfg = self.config
        return dynamic_size_pixels(rgb, cfg.patch_size * cfg.merge, *cfg.pixel_limits, cfg.image_mean, cfg.image_std)

    def prepare(self, rgb: np.ndarray) -> ImageInput:
        pixels = self.preprocess(rgb)
        side = self.config.patch_size * self.config.merge
        rows, cols = pixels.shape[1] // side, pixels.shape[2] // side
        if max(rows, cols) * self.config.merge > self.tower.max_side:
            raise ValueError(f"the image's {rows} x {cols} token grid is over the encoder's position table "
                             f"({self.tower.max_side} patches per side)")
        return ImageInput(pixels, rows * cols)

    def encode(self, image: ImageInput) -> torch.Tensor:
        return self.tower(image.pixels)


ENCODERS: dict[str, type] = {"gemma3": Gemma3Encoder, "qwen2vl_merger": QwenVLEncoder,
                             "qwen2.5vl_merger": QwenVLEncoder, "qwen3vl_merger": QwenVLEncoder,
                             "pixtral": PixtralEncoder, "gemma4v": Gemma4Encoder}


def load_vision_encoder(path: str | os.PathLike[str]) -> VisionEncoder:
    config, tensors = read_mmproj(path)
    cls = ENCODERS.get(config.projector)
    if cls is None:
        raise ModelLoadError(f"{path}: no vision encoder for the projector type {config.projector!r} "
                             f"(supported: {', '.join(sorted(ENCODERS))})")
    return cls(config, tensors)
