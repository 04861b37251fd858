"""The server's shape: endpoints talk to one EngineClient, nothing in hitenter/server reaches
into the engine but the client adapter, no import circles; prompt scoring and embeddings are engine
work run between its steps (engine_jobs.py), with the numbers of the idle engine under load."""

from __future__ import annotations

import ast
import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.server.engine_jobs import EngineJobs
from hitenter.server.prompt_logprobs import run_now, score_job
from hitenter.testing.live_server import LiveServer, live_server, wait_until
from hitenter.testing.paths import PACKAGE

SERVER = PACKAGE / "server"
ADAPTERS = {"local_engine.py", "prompt_logprobs.py"}     # the client adapter and the jobs it runs
INTERNALS = re.compile(r"\.engine\.engine\b|\.runner\b|\.kv_manager\b|(?<!snap)\.scheduler\b|trace_requests|last_logits"
                       r"|last_traces|\.parts\.|run_on_snapshot")


def test_no_reach_into_the_engine() -> None:
    hits = [f"{p.name}:{i}: {line.strip()}" for p in sorted(SERVER.glob("*.py")) if p.name not in ADAPTERS
            for i, line in enumerate(p.read_text().splitlines(), 1) if INTERNALS.search(line)]
    assert not hits, hits


def _imports(path: Path) -> set[str]:
    """hitenter.server modules imported at module level (not inside functions)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hitenter.server"):
            if node.module == "hitenter.server":
                out |= {f"hitenter.server.{a.name}" for a in node.names}
            else:
                out.add(node.module)
    return out


def test_no_import_circles() -> None:
    graph = {f"hitenter.server.{p.stem}": _imports(p) for p in SERVER.glob("*.py") if p.stem != "__init__"}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, " -> ".join(path + [m])
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            visit(d, path + [m])
        state[m] = 2
    for m in sorted(graph):
        visit(m, [])


class _Engine:
    def __init__(self) -> None:
        self.subs: list[Any] = []
        self.wakes = 0

    def subscribe(self, fn: Any) -> Any:
        self.subs.append(fn)
        return lambda: self.subs.remove(fn)

    def request_abort(self, rid: str) -> None:
        self.wakes += 1

    def step(self) -> None:
        for fn in list(self.subs):
            fn(None)


def test_engine_jobs_one_slice_per_step() -> None:
    async def run() -> None:
        eng = _Engine()
        jobs = EngineJobs(eng)

        def work(n: int, fail: bool = False) -> Any:
            for _ in range(n):
                yield
            if fail:
                raise ValueError("bad")
            return n

        a, b, c = jobs.submit(work(2)), jobs.submit(work(1, fail=True)), jobs.submit(work(5))
        c.cancel()
        for _ in range(6):
            eng.step()
            await asyncio.sleep(0)
        assert await a == 2 and eng.wakes >= 3
        with pytest.raises(ValueError):
            await b
        assert jobs.pending == 0 and not eng.subs          # nothing left subscribed
        d = jobs.submit(work(0))
        jobs.close()
        with pytest.raises(RuntimeError):
            await d
    asyncio.run(run())


@pytest.fixture(scope="module")
def engine(tiny_llama_path: Path) -> LLMEngine:
    return LLMEngine(str(tiny_llama_path), max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def server(engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(engine, served_model_name="tiny", playground=False)) as srv:
        yield srv


PROMPT = "the cat is on the mat and the dog is in the house " * 6       # several 64-token slices


def _score(url: str) -> list[float]:
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["token_logprobs"][1:]


def _stream(url: str, seed: int, n: int = 40) -> list[str]:
    body = {"prompt": f"stream {seed}", "max_tokens": n, "temperature": 1.0, "seed": seed, "ignore_eos": True}
    return httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]


STREAMS = 16


def _sliced(make: Any, slices: list[tuple[int, int]], last: list[tuple[int, int]]) -> Any:
    """``make``'s job, recording (engine step id, requests running) as each of its slices runs."""
    def job(*args: Any, **kw: Any) -> Any:
        work = make(*args, **kw)
        while True:
            slices.append(last[0])
            try:
                next(work)
            except StopIteration as done:
                return done.value
            yield
    return job


@pytest.mark.slow
def test_scores_and_embeddings_under_load_equal_idle(server: LiveServer, engine: LLMEngine,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt logprobs and embeddings while 16 streams decode: the numbers of the idle engine, the
    streams' texts those of the streams alone, and at most one job slice between two engine steps
    (so no stream step waits on them beyond one slice), all while the 16 streams were running."""
    from hitenter.server import local_engine

    ids = engine.tokenizer.encode(PROMPT)
    direct = [lp.logprob for lp in run_now(score_job(engine, [ids], 1, 10_000))[0].logprobs[1:]]
    idle, idle_streams = _score(server.url), [_stream(server.url, s, 160) for s in range(STREAMS)]
    embed = {"input": [PROMPT, "short"]}
    idle_vecs = httpx.post(server.url + "/v1/embeddings", json=embed, timeout=60).json()["data"]
    assert idle == pytest.approx(direct, abs=1e-5)          # sliced on the engine thread = one forward
    slices: list[tuple[int, int]] = []
    last = [(-1, 0)]
    unsubscribe = engine.subscribe(lambda ev: last.__setitem__(0, (ev.step_id, ev.num_running)))
    monkeypatch.setattr(local_engine, "score_job", _sliced(local_engine.score_job, slices, last))
    monkeypatch.setattr(local_engine, "pool_job", _sliced(local_engine.pool_job, slices, last))
    got: dict[str, Any] = {}

    def load(s: int) -> None:
        got[f"s{s}"] = _stream(server.url, s, 160)

    threads = [threading.Thread(target=load, args=(s,)) for s in range(STREAMS)]
    try:
        for t in threads:
            t.start()
        assert wait_until(lambda: last[0][1] == STREAMS, timeout=30), last   # all 16 decoding
        busy = [_score(server.url) for _ in range(2)]
        vecs = httpx.post(server.url + "/v1/embeddings", json=embed, timeout=60).json()["data"]
        for t in threads:
            t.join(120)
    finally:
        unsubscribe()
    assert all(b == idle for b in busy)
    assert [v["embedding"] for v in vecs] == [v["embedding"] for v in idle_vecs]
    assert [got[f"s{s}"] for s in range(STREAMS)] == idle_streams
    steps = [step for step, _ in slices]
    assert len(slices) >= 6 and len(steps) == len(set(steps)), slices          # one slice per step at most
    assert sum(running == STREAMS for _, running in slices) >= len(slices) // 2, slices   # beside 16 streams
