"""What the hybrid families (models/families/lfm2*.py, granitehybrid.py, nemotron_h*.py) refuse at load, each
in one line naming it, and what they leave out (a Nemotron converter's MTP block), from the metadata of the
tiny golden GGUFs (hitenter/testing/tiny_hybrids.py) with a key or tensor name changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitenter.errors import ModelLoadError
from hitenter.models.families import family_for
from hitenter.models.gguf import open_gguf, read_gguf_metadata
from hitenter.testing.hybrid_goldens import golden, tiny


def _config(family: str, tmp_path: Path, **changes: object) -> None:
    """The family's config from the golden file's metadata with `changes` (key suffix -> value, None drops
    it); ModelLoadError or the config."""
    path = tiny(family, golden(family), tmp_path)
    reader = open_gguf(path)
    values, names = read_gguf_metadata(reader), {t.name for t in reader.tensors}
    arch = values["general.architecture"]
    for key, value in changes.items():
        if key.startswith("tensor:"):
            names.add(key.removeprefix("tensor:"))
        elif value is None:
            values.pop(f"{arch}.{key}")
        else:
            values[f"{arch}.{key}"] = value
    family_for(arch).config(values, names)


@pytest.mark.parametrize(("family", "changes", "says"), [
    ("granitehybrid", {"tensor:blk.1.attn_output.bias": 1}, "biases"),
    ("lfm2", {"attention.sliding_window": 8}, "sliding-window"),
    ("lfm2moe", {"expert_gating_func": 4}, "expert_gating_func 4"),
    ("nemotron_h_moe", {"expert_group_count": 4}, "expert groups"),
    ("nemotron_h_moe", {"tensor:blk.1.ffn_latent_down.weight": 1}, "latent"),
    ("nemotron_h", {"attention.head_count_kv": [0, 0, 2, 0, 0]}, "5 entries for 6 layers"),
])
def test_unsupported_hybrid_files_fail_at_load_in_one_line(family: str, changes: dict, says: str,
                                                          tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        _config(family, tmp_path, **changes)
    msg = str(err.value)
    assert says in msg and "\n" not in msg, msg


def test_nemotron_mtp_blocks_are_left_out(tmp_path: Path) -> None:
    """A converter's appended MTP block (nextn_predict_layers) is not a layer: block_count and the per-layer
    arrays are cut to the trunk."""
    path = tiny("nemotron_h", golden("nemotron_h"), tmp_path)
    reader = open_gguf(path)
    values = read_gguf_metadata(reader)
    for key in ("attention.head_count_kv", "feed_forward_length"):
        values[f"nemotron_h.{key}"] = [*values[f"nemotron_h.{key}"], 2]
    values.update({"nemotron_h.block_count": 7, "nemotron_h.nextn_predict_layers": 1})
    cfg = family_for("nemotron_h").config(values, {t.name for t in reader.tensors})
    assert cfg.num_layers == 6 and cfg.layer_types == ("mamba2", "ffn", "attention", "ffn", "mamba2", "ffn")
