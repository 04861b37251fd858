"""A rerank served beside chat streams on one server (a chat model and a reranker, two engines of one process
sharing its cores through hitenter/engine/cpu_share.py): it finishes while the streams run, with the scores
it gets alone, and the streams go on."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from hitenter.engine.cpu_share import process_share
from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server, wait_until
from hitenter.testing.tiny_encoders import DOCS, QUERY, write_tiny_encoder
from hitenter.testing.tiny_model import write_tiny_gguf

pytestmark = pytest.mark.slow

MANY_DOCS = [f"{d} {i}" for i in range(24) for d in DOCS]     # several pooling slices


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("beside")
    chat = LLMEngine(str(write_tiny_gguf(d / "chat.gguf")), dtype="float32", kv_cache_dtype="float32",
                     max_num_batched_tokens=64)
    rank = LLMEngine(str(write_tiny_encoder(d / "rank.gguf", "bert_rank")), dtype="float32",
                     kv_cache_dtype="float32", max_num_batched_tokens=64)
    with live_server(create_app(chat, served_model_name="chat", extra_engines={"rank": rank})) as srv:
        yield srv


def _rerank(url: str) -> dict[int, float]:
    r = httpx.post(url + "/v1/rerank", json={"model": "rank", "query": QUERY, "documents": MANY_DOCS}, timeout=120)
    assert r.status_code == 200, r.text
    return {x["index"]: x["relevance_score"] for x in r.json()["results"]}


def _stream(url: str, stop: threading.Event, chunks: list[int]) -> None:
    body = {"model": "chat", "prompt": "hello", "max_tokens": 64, "ignore_eos": True, "stream": True}
    while not stop.is_set():
        with httpx.Client(base_url=url, timeout=120) as c, c.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(1)


def test_rerank_finishes_beside_streams_with_its_scores_alone(server: LiveServer) -> None:
    alone = _rerank(server.url)
    assert sorted(alone) == list(range(len(MANY_DOCS)))
    stop, chunks = threading.Event(), []
    threads = [threading.Thread(target=_stream, args=(server.url, stop, chunks), daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        assert wait_until(process_share().generating, 60)   # the streams run (the server is in this process)
        got = len(chunks)
        beside = _rerank(server.url)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert beside.keys() == alone.keys()
    for i, s in alone.items():
        assert beside[i] == pytest.approx(s, abs=1e-5)
    assert len(chunks) > got                     # the streams went on
