"""Fake model wheels for the registry's pull path, offline: wheels written into a local --find-links
folder, and a known model made of them registered for one test."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from hitenter.models.registry import KNOWN_MODELS, KnownModel


def fake_wheel(dist_dir: Path, pkg: str, version: str, payload: bytes) -> None:
    """Write a wheel of `pkg` into `dist_dir` whose one data file is `payload` (a model part as pip fetches it)."""
    mod = pkg.replace("-", "_")
    info = f"{mod}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": b"",
        f"{mod}/data/part01.bin": payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(dist_dir / f"{mod}-{version}-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", record)


def register_fake_model(monkeypatch: pytest.MonkeyPatch, name: str, sha: str) -> None:
    """Register `name` for this test as the two fake parts `hitenter-fake-part1/2` with this sha256."""
    wheels = (("hitenter-fake-part1", "0.1.0"), ("hitenter-fake-part2", "0.1.0"))
    monkeypatch.setitem(KNOWN_MODELS, name, KnownModel(name, wheels, "*/data/part*.bin", sha, "fake"))
