"""The model cache: a file changed in place (same size, same mtime) is refused before it serves, with
a message saying what to do; a read-only cache with valid files works; a read-only cache without the
file fails with one clear error."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from hitenter.errors import ModelLoadError
from hitenter.models.registry import KNOWN_MODELS, KnownModel, model_path, pull, resolve_model

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def _no_pip(*a: object, **k: object) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(a, 1, "", "ERROR: network is unreachable (test)")


@pytest.fixture()
def cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A known model 'fake-cached' already in a temp HITENTER_HOME, verified once (sidecar written)."""
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(KNOWN_MODELS, "fake-cached", KnownModel(
        "fake-cached", (("hitenter-fake-absent", "0.0.1"),), "*/data/*", hashlib.sha256(PAYLOAD).hexdigest(), "t"))
    monkeypatch.setattr(subprocess, "run", _no_pip)
    path = model_path("fake-cached")
    path.parent.mkdir(parents=True)
    path.write_bytes(PAYLOAD)
    assert resolve_model("fake-cached") == path
    assert path.with_name(path.name + ".verified").is_file() and path.with_name(path.name + ".sha256").is_file()
    return path


def _corrupt_in_place(path: Path) -> None:
    st = path.stat()
    with open(path, "r+b") as f:          # same size, zeroed, mtime put back
        f.write(bytes(st.st_size))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_in_place_corruption_is_refused_with_advice(cached: Path) -> None:
    _corrupt_in_place(cached)
    with pytest.raises(ModelLoadError) as ei:
        resolve_model("fake-cached")
    msg = str(ei.value)
    assert "failed its sha256 check" in msg and str(cached) in msg and "hitenter pull fake-cached" in msg
    with pytest.raises(ModelLoadError) as ei:     # pull tries again; offline it says both things
        pull("fake-cached")
    assert "failed its sha256 check" in str(ei.value) and "downloading it again failed" in str(ei.value)


def test_unwritable_cache_without_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No traceback: one error naming the directory and what to do (works as root too: the 'directory'
    is under a regular file, so mkdir fails whatever the permissions)."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "a-file" / "home"))
    monkeypatch.setitem(KNOWN_MODELS, "fake-ro", KnownModel("fake-ro", (("x", "1"),), "*", "0" * 64, "t"))
    with pytest.raises(ModelLoadError, match="cannot write the model cache.*HITENTER_HOME"):
        resolve_model("fake-ro")


def test_read_only_cache_without_sidecar_rehashes(cached: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale sidecar that cannot be rewritten: the file is hashed and served, no OSError escapes."""
    side = cached.with_name(cached.name + ".verified")
    side.write_text("stale\n")
    real_write = Path.write_text

    def read_only(self: Path, *a: object, **k: object) -> int:
        if self.parent == side.parent:
            raise PermissionError(13, "Read-only file system", str(self))
        return real_write(self, *a, **k)   # type: ignore[arg-type]
    monkeypatch.setattr(Path, "write_text", read_only)
    assert resolve_model("fake-cached") == cached
    assert side.read_text() == "stale\n"
