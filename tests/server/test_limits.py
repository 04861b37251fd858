"""Bounded work for every request: deep or oversized input is a 4xx naming the
field and the limit, in each API's own error shape, within a second; grammar compilation is bounded in
time (off the engine thread, a spec that ran out refused at once after) and its cache by bytes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hitenter.engine import structured
from hitenter.engine.llm_engine import LLMEngine
from hitenter.engine.structured import GrammarTimeoutError, backend_for
from hitenter.sampling_params import StructuredSpec
from hitenter.server import body_limits
from hitenter.server.api import create_app
from hitenter.testing.live_server import assert_error

D = 1000
DEEP = '{"type":"object","properties":{"a":' * D + '{"type":"string"}' + "}}" * D
ARR = "[" * D + "]" * D
USER = '[{"role":"user","content":"hi"}]'
CHAT = '"messages":' + USER + ',"max_tokens":1'
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client(engine: LLMEngine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, served_model_name="tiny"), raise_server_exceptions=False) as c:
        yield c


def _post(client: TestClient, path: str, body: str, slow_ok: bool = False) -> Any:
    """A refusal within a second (a served request: compiling and generating may take longer)."""
    t0 = time.perf_counter()
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert slow_ok or time.perf_counter() - t0 < 1.0, (path, r.text[:200])
    return r


DEEP_OPENAI = [
    ("response_format", '{' + CHAT + ',"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":'
     + DEEP + '}}}'),
    ("guided_json", '{' + CHAT + ',"guided_json":' + json.dumps(DEEP) + '}'),          # a string schema
    ("guided_json", '{' + CHAT + ',"guided_json":' + DEEP + '}'),
    ("structured_outputs", '{' + CHAT + ',"structured_outputs":{"json":' + json.dumps(DEEP) + '}}'),
    ("tools", '{' + CHAT + ',"tools":[{"type":"function","function":{"name":"f","parameters":' + DEEP + '}}]}'),
    ("messages", '{"max_tokens":1,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,'
     '"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":' + json.dumps(ARR) + '}}]},'
     '{"role":"tool","tool_call_id":"c","content":"x"}]}'),
    ("logit_bias", '{' + CHAT + ',"logit_bias":' + "[" * 100_000 + "]" * 100_000 + '}'),
    ("stop", '{' + CHAT + ',"stop":' + "[" * 100 + "]" * 100 + '}'),
]


@pytest.mark.parametrize("param,body", DEEP_OPENAI, ids=[f"{p}-{i}" for i, (p, _) in enumerate(DEEP_OPENAI)])
def test_deep_input_is_a_400_naming_the_field(client: TestClient, param: str, body: str) -> None:
    e = assert_error(_post(client, "/v1/chat/completions", body), 400, param)
    assert "nested deeper than" in e["message"] and "limit" in e["message"]


def test_deep_input_in_each_dialect(client: TestClient) -> None:
    r = _post(client, "/api/chat", '{"model":"tiny","messages":' + USER + ',"format":' + DEEP + ',"stream":false}')
    assert r.status_code == 400 and r.json()["error"].startswith("format: nested deeper"), r.text
    r = _post(client, "/v1/messages", '{"model":"tiny","max_tokens":1,"messages":' + USER
              + ',"output_config":{"format":{"type":"json_schema","schema":' + DEEP + '}}}')
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["message"].startswith("output_config: nested deeper"), r.text
    r = _post(client, "/v1/responses", '{"model":"tiny","input":"hi","max_output_tokens":1,"text":{"format":'
              '{"type":"json_schema","name":"x","schema":' + DEEP + '}}}')
    assert_error(r, 400, "text")
    r = _post(client, "/v1/completions", '{"prompt":"hi","max_tokens":1,"guided_json":' + json.dumps(DEEP) + '}')
    assert_error(r, 400, "guided_json")


@pytest.mark.parametrize("field,value,flag", [
    ("stop", ["ab"] * 100_000, "--max-stop"),
    ("logit_bias", {str(i): 1 for i in range(5000)}, "--max-logit-bias"),
    ("tools", [{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)], "--max-tools"),
])
def test_list_sizes(client: TestClient, field: str, value: Any, flag: str) -> None:
    body = json.dumps({"messages": json.loads(USER), "max_tokens": 1, field: value})
    assert flag in assert_error(_post(client, "/v1/chat/completions", body), 400, field)["message"]


@pytest.mark.parametrize("field,value,flag", [
    ("guided_choice", [f"c{i}" for i in range(100_000)], "--max-guided-choices"),
    ("guided_choice", ["x" * 40_000, "y" * 40_000], "--max-guided-choice-chars"),
    ("guided_json", {"enum": [f"c{i}" for i in range(100_000)]}, "--max-enum-values"),
    ("guided_json", {"type": "string", "pattern": "a" * 1_000_000}, "--max-pattern-chars"),
    ("guided_regex", "a" * 1_000_000, "--max-pattern-chars"),
    ("guided_grammar", 'root ::= "a"' + " " * 100_000, "--max-grammar-chars"),
    ("structured_outputs", {"choice": [f"c{i}" for i in range(5000)]}, "--max-guided-choices"),
])
def test_grammar_inputs_over_their_size_are_413(client: TestClient, field: str, value: Any, flag: str) -> None:
    body = json.dumps({"messages": json.loads(USER), "max_tokens": 1, field: value})
    assert flag in assert_error(_post(client, "/v1/chat/completions", body), 413, field)["message"]


def test_ollama_enum_413_in_its_shape(client: TestClient) -> None:
    body = json.dumps({"model": "tiny", "messages": json.loads(USER), "stream": False,
                       "format": {"enum": [f"c{i}" for i in range(100_000)]}})
    r = _post(client, "/api/chat", body)
    assert r.status_code == 413 and "--max-enum-values" in r.json()["error"], r.text


def test_reasonable_input_still_served(client: TestClient) -> None:
    nested = '{"type":"object","properties":{"a":' * 30 + '{"type":"string"}' + "}}" * 30
    body = '{' + CHAT + ',"guided_json":' + nested + '}'
    assert _post(client, "/v1/chat/completions", body, slow_ok=True).status_code == 200
    body = json.dumps({"messages": json.loads(USER), "max_tokens": 1, "guided_choice": ["yes", "no"],
                       "stop": ["a"] * 64, "logit_bias": {"1": 1}})
    assert _post(client, "/v1/chat/completions", body, slow_ok=True).status_code == 200


def test_cache_bounded_by_bytes(engine: LLMEngine) -> None:
    backend = backend_for(engine.tokenizer, engine.model_config.vocab_size)
    old = structured.CACHE_BYTES
    one = int(backend.compile(StructuredSpec("choice", '["v9"]', "guided_choice")).memory_size_bytes)
    structured.configure(cache_bytes=3 * one)     # the older, larger entries go first
    try:
        for i in range(8):
            backend.compile(StructuredSpec("choice", json.dumps([f"v{i}"]), "guided_choice"))
        assert backend.cache_bytes <= structured.CACHE_BYTES and len(backend._cache) <= 3
        assert StructuredSpec("choice", '["v7"]', "guided_choice") in backend._cache
        assert StructuredSpec("choice", '["v0"]', "guided_choice") not in backend._cache
    finally:
        structured.configure(cache_bytes=old)


def test_compilation_time_limit(engine: LLMEngine) -> None:
    """A compilation past the limit is a GrammarTimeoutError (a 400 naming the field) and refused at once
    after; the caller's wait is bounded by the limit, not by the compilation."""
    backend = backend_for(engine.tokenizer, engine.model_config.vocab_size)
    spec = StructuredSpec("choice", json.dumps([f"choice-{i}" for i in range(10_000)]), "guided_choice")
    t0 = time.perf_counter()
    with pytest.raises(GrammarTimeoutError, match="guided_choice: grammar compilation ran past the 0.2 s"):
        backend.compile(spec, timeout=0.2)      # seconds to compile: it starts at once and runs out
    with pytest.raises(GrammarTimeoutError, match="already ran past"):
        backend.compile(spec)
    assert time.perf_counter() - t0 < 0.8


def test_compile_timeout_is_a_400(client: TestClient) -> None:
    old = structured.COMPILE_SECONDS
    structured.configure(compile_seconds=0.001)
    try:
        body = json.dumps({"messages": json.loads(USER), "max_tokens": 1,
                           "guided_choice": [f"slow-{i}" for i in range(1000)]})
        e = assert_error(_post(client, "/v1/chat/completions", body), 400, "guided_choice")
        assert "--max-grammar-compile-seconds" in e["message"]
    finally:
        structured.configure(compile_seconds=old)


def test_depth_check_has_no_recursion() -> None:
    assert body_limits.depth_over([[[]]], 2) and not body_limits.depth_over([[[]]], 3)
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert body_limits.depth_over(deep, 64)
    assert body_limits.deep_field(b'{"a": 1, "b": [[[[1]]]], "c": 2}', 3) == "b"


def test_a_queued_compilation_is_cancelled_when_its_caller_leaves(engine: LLMEngine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile threads busy: a spec waits in the queue; its caller leaving cancels it (not refused:
    it may be asked for again); a second caller of the same spec keeps it queued until it leaves too."""
    backend = backend_for(engine.tokenizer, engine.model_config.vocab_size)
    pool, hold = ThreadPoolExecutor(1), threading.Event()
    monkeypatch.setattr(type(backend), "_pool", pool)
    try:
        pool.submit(hold.wait, 30)                   # the only thread, busy
        queued = StructuredSpec("choice", '["queued-spec"]', "guided_choice")
        fut, again = backend.submit(queued), backend.submit(queued)
        assert fut is again and not fut.running()
        backend.abandon(queued, fut)
        assert not fut.cancelled()                   # the other caller still waits
        backend.abandon(queued, fut)
        assert fut.cancelled() and queued not in backend._inflight and hash(queued) not in backend._refused
    finally:
        hold.set()
        pool.shutdown(wait=True)


def test_body_limits_import_light() -> None:
    """The body-check worker runs body_limits alone: no FastAPI, no torch (hundreds of MB, seconds)."""
    code = ("import sys, hitenter.server.body_limits; "
            "print(sorted({'fastapi', 'torch', 'pydantic'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_large_bodies_checked_in_the_worker_as_in_place() -> None:
    """A body over INLINE_BYTES gets the worker's verdict, the same as the in-process check's; a worker
    that died is replaced, and the body it died on still gets its verdict."""
    checker = body_limits.BodyChecker()
    over = json.dumps({"messages": json.loads(USER), "guided_choice": [f"c{i}" for i in range(100_000)]}).encode()
    fine = json.dumps({"messages": json.loads(USER), "prompt": "a" * 200_000}).encode()
    deep = b'{"logit_bias":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert len(fine) > body_limits.INLINE_BYTES
    for body in (over, fine, deep):
        got, want = asyncio.run(checker.problem(body)), body_limits.body_problem(body)
        assert (got and (got.status, got.message, got.param)) == (want and (want.status, want.message, want.param))
    first = checker.worker_pid
    assert first is not None and first != os.getpid()
    os.kill(first, signal.SIGKILL)
    time.sleep(0.2)
    got = asyncio.run(checker.problem(over))
    assert got is not None and got.status == 413 and "--max-guided-choices" in got.message
    assert asyncio.run(checker.problem(fine)) is None and checker.worker_pid not in (None, first)
    checker._stop()
    # a worker that exits without a verdict: the body it took is checked in place, then a new one starts
    checker._proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read(8)"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    got = asyncio.run(checker.problem(over))
    assert got is not None and got.status == 413 and checker.worker_pid is None
    assert asyncio.run(checker.problem(over)) is not None and checker.worker_pid is not None
    checker._stop()


def test_a_client_looping_refusals_is_paced() -> None:
    pacer = body_limits.RefusalPacer()
    assert [pacer.delay("10.0.0.1") for _ in range(body_limits.PACE_FREE)] == [0.0] * body_limits.PACE_FREE
    assert pacer.delay("10.0.0.1") == body_limits.PACE_DELAY_S          # one more within the window
    assert pacer.delay("10.0.0.2") == 0.0                              # another client is not
