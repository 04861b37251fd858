"""The recurrent mixer of each layer type (ModelConfig.layer_types): one entry per kind, its class in
the file of that name beside this one."""

from __future__ import annotations

from hitenter.models.recurrent.base import RecurrentMixer
from hitenter.models.recurrent.gated_deltanet import GatedDeltaNet
from hitenter.models.recurrent.mamba2 import Mamba2
from hitenter.models.recurrent.short_conv import ShortConv

MIXERS: dict[str, type[RecurrentMixer]] = {}
MIXERS["gated_deltanet"] = GatedDeltaNet
MIXERS["short_conv"] = ShortConv
MIXERS["mamba2"] = Mamba2
