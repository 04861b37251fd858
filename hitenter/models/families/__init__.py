"""Model families: one file per `general.architecture`, each stating what its decoder does differently
from Llama's (base.Family); hitenter/models/decoder.py runs them all.

`family_for(arch)` returns the family of a GGUF's architecture, or raises ModelLoadError naming the
architecture and the supported ones. Adding a family: a file here with a `FAMILY` and its name in
`_MODULES`, plus a tiny GGUF in hitenter/testing/tiny_families.py and its llama.cpp golden.
"""

from __future__ import annotations

import importlib

from hitenter.errors import ModelLoadError
from hitenter.models.families.base import Family

_MODULES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "granite", "olmo2", "smollm3",
            "gpt_oss", "qwen35", "qwen35moe", "qwen3next", "lfm2", "lfm2moe",
            "granitehybrid", "nemotron_h", "nemotron_h_moe", "bert", "nomic_bert", "nomic_bert_moe",
            "gemma_embedding",
            "mistral3", "llama4", "gemma4", "qwen2vl", "qwen3vl", "qwen3vlmoe")
FAMILIES: dict[str, Family] = {
    fam.arch: fam for fam in (importlib.import_module(f"{__name__}.{m}").FAMILY for m in _MODULES)}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(sorted(FAMILIES))


def family_for(arch: str) -> Family:
    """The family of general.architecture `arch`; ModelLoadError (one line) when hitenter has none."""
    fam = FAMILIES.get(arch)
    if fam is None:
        raise ModelLoadError(f"unsupported model architecture {arch!r}; supported architectures: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return fam


__all__ = ["FAMILIES", "SUPPORTED_ARCHITECTURES", "Family", "family_for"]
