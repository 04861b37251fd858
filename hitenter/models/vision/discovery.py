"""Finding the mmproj file that belongs to a text model: `mmproj*.gguf` files in the model file's folder (as
llama.cpp's and the hub's GGUF repositories ship them), kept only where they fit the model: the projector's
family matches the text model's architecture and its output width is the model's hidden size. A folder
holding models of several families (a model cache) therefore never attaches one model's projector to another.

Contract: find_mmproj(model_path, arch, hidden) -> the one fitting file, or None where none fits; several
fitting files is a ModelLoadError naming them (the caller then names one, as `--mmproj`). check_mmproj_fits
raises ModelLoadError where a named file does not fit.
"""

from __future__ import annotations

import os
from pathlib import Path

from hitenter.errors import ModelLoadError
from hitenter.models.gguf import open_gguf, read_gguf_metadata
from hitenter.models.vision.mmproj import MmprojConfig, mmproj_config

# the text architectures each projector feeds
PROJECTOR_ARCHS: dict[str, frozenset[str]] = {
    "gemma3": frozenset({"gemma3"}),
    "qwen2vl_merger": frozenset({"qwen2vl"}),
    "qwen2.5vl_merger": frozenset({"qwen2vl"}),
    "qwen3vl_merger": frozenset({"qwen3vl", "qwen3vlmoe"}),
    "pixtral": frozenset({"llama", "mistral3"}),   # Pixtral 12B / Mistral Small 3.1 (llama), Ministral 3
    "gemma4v": frozenset({"gemma4"}),
}


def read_mmproj_config(path: str | os.PathLike[str]) -> MmprojConfig:
    """The MmprojConfig of a file, from its header only (no tensors read)."""
    p = Path(path)
    return mmproj_config(read_gguf_metadata(open_gguf(p)), p)


def check_mmproj_fits(cfg: MmprojConfig, path: Path, arch: str, hidden: int) -> None:
    """ModelLoadError unless the projector feeds `arch` and its output width is `hidden`."""
    if arch not in PROJECTOR_ARCHS.get(cfg.projector, frozenset()):
        raise ModelLoadError(f"{path}: a {cfg.projector} vision projector does not fit a {arch} text model")
    if cfg.projection_dim != hidden:
        raise ModelLoadError(f"{path}: the projector's output width {cfg.projection_dim} is not the text "
                             f"model's hidden size {hidden}")


def find_mmproj(model_path: str | os.PathLike[str], arch: str, hidden: int) -> Path | None:
    """The mmproj file beside `model_path` that fits the model (see the module contract)."""
    model = Path(model_path)
    fitting: list[Path] = []
    for cand in sorted(model.parent.glob("mmproj*.gguf")):
        if cand.resolve() == model.resolve() or not cand.is_file():
            continue
        try:
            check_mmproj_fits(read_mmproj_config(cand), cand, arch, hidden)
        except ModelLoadError:
            continue
        fitting.append(cand)
    if len(fitting) > 1:
        raise ModelLoadError(f"several mmproj files beside {model.name} fit it ({', '.join(p.name for p in fitting)}): "
                             "name one with --mmproj")
    return fitting[0] if fitting else None
