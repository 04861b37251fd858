"""The image panel's geometry (hitenter/server/playground_vision.py geometry) for a Gemma 4 mmproj: patch grid,
3 x 3 average pooling into the token grid, one cell per row."""

from __future__ import annotations

from types import SimpleNamespace

from hitenter.server.playground_vision import geometry


def test_gemma4_geometry() -> None:
    cfg = SimpleNamespace(patch_size=4, merge=3, projector="gemma4v")
    g = geometry(cfg, 84, 132, 77)   # tiny_gemma4v.py on a 100 x 70 image: 7 x 11 tokens
    assert g["patch_grid"] == [21, 33] and g["patches"] == 693 and g["token_grid"] == [7, 11]
    assert g["reduce"] == "average-pooled" and g["cells"] == list(range(77))
