"""A storm of clients that go away mid-request: every request aborted, every KV block free again."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import httpx
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server, wait_until

N_REQUESTS, DROP_RATE, CONCURRENCY, N_NON_STREAM_DROPS = 200, 0.3, 16, 8


def _greedy(url: str) -> str:
    r = httpx.post(url + "/v1/completions", json={"prompt": "the cat is", "max_tokens": 12, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200
    return str(r.json()["choices"][0]["text"])


async def _storm(url: str) -> dict[str, int]:
    rng = random.Random(1234)
    drops = set(rng.sample(range(N_REQUESTS), int(DROP_RATE * N_REQUESTS)))
    plans = [(i in drops, rng.randint(1, 6), rng.random() < 0.5, rng.random()) for i in range(N_REQUESTS)]
    sem = asyncio.Semaphore(CONCURRENCY)
    stats = {"dropped": 0, "completed": 0, "dropped_non_stream": 0}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        drop, after, chat, temp = plans[i]
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body: dict[str, object] = {"max_tokens": 16, "ignore_eos": True, "stream": True, "temperature": temp,
                                   "seed": i}
        if chat:
            body["messages"] = [{"role": "user", "content": f"request {i}"}]
        else:
            body["prompt"] = f"request {i} says"
        async with sem, client.stream("POST", url + path, json=body) as r:
            assert r.status_code == 200
            seen, finish = 0, None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if drop and seen >= after:
                    stats["dropped"] += 1
                    return                     # leaving the block closes the connection mid-stream
                seen += 1
                if line == "data: [DONE]":
                    break
                ch = json.loads(line[6:])
                assert "error" not in ch, ch
                for c in ch["choices"]:
                    finish = c.get("finish_reason") or finish
            assert finish == "length"
            stats["completed"] += 1

    async def dropped_non_stream(client: httpx.AsyncClient, i: int) -> None:
        body = {"prompt": f"slow {i}", "max_tokens": 200, "ignore_eos": True}
        try:
            await client.post(url + "/v1/completions", json=body, timeout=0.3)
        except httpx.TimeoutException:
            stats["dropped_non_stream"] += 1

    limits = httpx.Limits(max_connections=CONCURRENCY + N_NON_STREAM_DROPS, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks = [one(client, i) for i in range(N_REQUESTS)]
        tasks += [dropped_non_stream(client, i) for i in range(N_NON_STREAM_DROPS)]
        await asyncio.gather(*tasks)
    return stats


@pytest.mark.slow
def test_disconnect_storm_frees_everything(tiny_llama_path: Path) -> None:
    engine = LLMEngine(str(tiny_llama_path))
    app = create_app(engine, served_model_name="tiny")
    with live_server(app) as srv:
        before = _greedy(srv.url)
        stats = asyncio.run(asyncio.wait_for(_storm(srv.url), 120))
        assert stats["dropped"] == int(DROP_RATE * N_REQUESTS) and stats["dropped_non_stream"] == N_NON_STREAM_DROPS
        assert stats["completed"] + stats["dropped"] == N_REQUESTS
        async_engine = app.state.models["tiny"].engine
        assert wait_until(lambda: not engine.has_unfinished_requests(), 10)
        assert wait_until(lambda: engine.kv_manager.num_free_blocks == engine.parts.num_blocks, 10)
        assert engine.scheduler.num_running == 0 and engine.scheduler.num_waiting == 0
        assert not async_engine._streams                       # nobody left listening
        assert httpx.get(srv.url + "/health").status_code == 200
        assert _greedy(srv.url) == before
        text = httpx.get(srv.url + "/metrics").text
        aborted = [ln for ln in text.splitlines() if ln.startswith("hitenter:aborted_requests_total")]
        assert aborted and float(aborted[0].split()[-1]) >= N_NON_STREAM_DROPS


def test_long_requests_abort_at_once(tiny_llama_path: Path) -> None:
    """Requests that would run for seconds stop (and free their blocks) as soon as their client goes."""
    engine = LLMEngine(str(tiny_llama_path))
    app = create_app(engine, served_model_name="tiny")
    n_stream, n_plain = 6, 2

    async def go(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            async def stream(i: int) -> None:
                body = {"prompt": f"long {i}", "ignore_eos": True, "stream": True, "max_tokens": 240}
                async with client.stream("POST", url + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            return                           # first event, then gone

            async def plain(i: int) -> None:
                body = {"messages": [{"role": "user", "content": f"long {i}"}], "ignore_eos": True}
                try:
                    await client.post(url + "/v1/chat/completions", json=body, timeout=0.3)
                except httpx.TimeoutException:
                    return
                raise AssertionError("a whole-window request finished within 0.3 s")

            await asyncio.gather(*[stream(i) for i in range(n_stream)], *[plain(i) for i in range(n_plain)])

    with live_server(app) as srv:
        asyncio.run(go(srv.url))
        assert wait_until(lambda: not engine.has_unfinished_requests(), 1.5)
        assert wait_until(lambda: engine.kv_manager.num_free_blocks == engine.parts.num_blocks, 1.0)
        text = httpx.get(srv.url + "/metrics").text
        aborted = [ln for ln in text.splitlines() if ln.startswith("hitenter:aborted_requests_total")]
        assert float(aborted[0].split()[-1]) == n_stream + n_plain
        gen = [ln for ln in text.splitlines() if ln.startswith("hitenter:generation_tokens_total")]
        assert float(gen[0].split()[-1]) < (n_stream + n_plain) * 100       # nowhere near 8 x 240 tokens
