"""``hitenter run`` / ``chat`` through a running server (hitenter/remote.py), as ``ollama run`` does: the
same text as the server's own API gives, nothing heavy imported; a run with engine options, or with no
server, or for a model the server cannot serve, runs in its own process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hitenter import remote
from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server

PROBE = ("import sys\nfrom hitenter.cli import main\nrc = main(sys.argv[1:])\n"
         "print('torch imported:', 'torch' in sys.modules, 'rc:', rc, file=sys.stderr)\n")


@pytest.fixture(scope="module")
def server(tiny_qwen2_path: Path) -> Iterator[LiveServer]:
    with live_server(create_app(LLMEngine(str(tiny_qwen2_path)), "tiny", playground=False)) as srv:
        yield srv


def _cli(srv: LiveServer | None, *args: str, input: str | None = None,
         monkeypatch: pytest.MonkeyPatch | None = None) -> subprocess.CompletedProcess[str]:
    if srv is not None and monkeypatch is not None:
        monkeypatch.setenv("HITENTER_HOST", srv.url)
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300,
                          input=input)


def _chat(srv: LiveServer, content: str, n: int) -> str:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": n, "temperature": 0}
    return str(httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"])


def test_run_uses_the_server_and_imports_nothing_heavy(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    r = _cli(server, "run", "hello there", "--max-tokens", "6", monkeypatch=monkeypatch)
    assert r.returncode == 0 and "torch imported: False rc: 0" in r.stderr, r.stderr
    assert f"via the server at 127.0.0.1:{server.port}" in r.stderr and "[6 tokens" in r.stderr
    assert r.stdout == _chat(server, "hello there", 6) + "\n"
    raw = _cli(server, "run", "--raw", "once upon", "--max-tokens", "5", monkeypatch=monkeypatch)
    want = httpx.post(server.url + "/v1/completions", json={"prompt": "once upon", "max_tokens": 5, "temperature": 0},
                      timeout=60).json()["choices"][0]["text"]
    assert raw.returncode == 0 and raw.stdout == want + "\n" and "torch imported: False" in raw.stderr


def test_chat_keeps_the_conversation_on_the_server(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    r = _cli(server, "chat", "--max-tokens", "4", input="hi\nand then?\n\n", monkeypatch=monkeypatch)
    assert r.returncode == 0 and "torch imported: False" in r.stderr, r.stderr
    assert r.stderr.count("via the server") == 2


def test_a_refusal_is_the_servers_message(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    r = _cli(server, "run", "hi", "--max-tokens", "0", monkeypatch=monkeypatch)
    assert "rc: 2" in r.stderr and "the server refused the request (400)" in r.stderr and "max_tokens" in r.stderr


def test_a_server_with_a_key(tiny_qwen2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(LLMEngine(str(tiny_qwen2_path)), "tiny", playground=False, api_key="k-1")
    with live_server(app) as srv:
        r = _cli(srv, "run", "hi", "--max-tokens", "2", monkeypatch=monkeypatch)
        assert "rc: 2" in r.stderr and "set HITENTER_API_KEY" in r.stderr, r.stderr
        monkeypatch.setenv("HITENTER_API_KEY", "k-1")
        r = _cli(srv, "run", "hi", "--max-tokens", "2", monkeypatch=monkeypatch)
        assert "rc: 0" in r.stderr and "[2 tokens" in r.stderr and "torch imported: False" in r.stderr, r.stderr


@pytest.mark.slow
def test_engine_options_or_an_unknown_model_run_in_this_process(server: LiveServer, tiny_llama_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    r = _cli(server, "run", "hi", "--model", str(tiny_llama_path), "--max-model-len", "128", "--max-tokens", "2",
             monkeypatch=monkeypatch)
    assert r.returncode == 0 and "via the server" not in r.stderr and "torch imported: True" in r.stderr, r.stderr
    r = _cli(server, "run", "hi", "--model", str(tiny_llama_path), "--max-tokens", "2", monkeypatch=monkeypatch)
    assert r.returncode == 0 and "the server answered 404" in r.stderr and "running the model in this process" \
        in r.stderr and "[2 tokens" in r.stderr, r.stderr


@pytest.mark.slow
def test_no_server_runs_in_this_process(tiny_llama_path: Path) -> None:
    r = _cli(None, "run", "hi", "--model", str(tiny_llama_path), "--max-tokens", "2")
    assert r.returncode == 0 and "via the server" not in r.stderr and "[2 tokens" in r.stderr, r.stderr


def test_server_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HITENTER_HOST")
    monkeypatch.delenv("HITENTER_API_KEY", raising=False)
    assert remote.server_address() == remote.Server("127.0.0.1", 8000)
    monkeypatch.setenv("HITENTER_HOST", "0.0.0.0:11434")
    monkeypatch.setenv("HITENTER_API_KEY", "k")
    assert remote.server_address() == remote.Server("0.0.0.0", 11434, "k")
    assert remote.server_address("http://box") == remote.Server("box", 8000, "k")
    with pytest.raises(ValueError):
        remote.server_address("https://box:1")
    assert not remote.running(remote.server_address("127.0.0.1:9"))
