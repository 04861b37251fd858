"""Embeddings and reranking through a live server, checked against llama.cpp's own numbers on the same tiny
files (tests/goldens/encoders/, scripts/make_encoder_goldens.py): the openai client's embeddings.create
(token-id inputs, so the vectors are llama.cpp's pooled ones, L2-normalized), Matryoshka `dimensions`,
/v1/rerank, /rerank and TEI's shape with llama-server's pair tokens and scores, vLLM's /score, and the 400s
(a chat request to an encoder, an embedding request to a reranker, a rerank with a model of pooling none);
text inputs tokenized as llama.cpp does (WordPiece, unigram), also through LangChain's OllamaEmbeddings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.server.serving_rerank import rerank_tokens
from hitenter.testing.live_server import LiveServer, live_server
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tiny_encoders import DOCS, QUERY, TEXTS, write_tiny_encoder

FAMILIES = ("bert", "bert_rank", "bert_rank_xlmr", "nomic-bert", "nomic-bert-moe", "gemma-embedding", "qwen3_embed",
            "qwen3_rank")
EMBEDDERS = ("bert", "nomic-bert", "nomic-bert-moe", "gemma-embedding", "qwen3_embed")
RERANKERS = ("bert_rank", "bert_rank_xlmr", "qwen3_rank")
TOL = {"bert": 2e-3, "gemma-embedding": 2e-3, "bert_rank": 2e-3, "bert_rank_xlmr": 2e-3, "nomic-bert-moe": 2e-3}      # ggml's fp16 GELU (tests/models/families)

pytestmark = pytest.mark.slow


def _golden(family: str) -> dict[str, np.ndarray]:
    with np.load(GOLDENS / "encoders" / f"{family}.npz") as z:
        return {k: z[k] for k in z.files}


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    out, s = [], 0
    for n in lengths.tolist():
        out.append(flat[s:s + n].tolist())
        s += n
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("encoders")
    engines = {f: LLMEngine(str(write_tiny_encoder(Path(d) / f"{f}.gguf", f)), dtype="float32",
                            kv_cache_dtype="float32") for f in FAMILIES}
    first = engines.pop(FAMILIES[0])
    with live_server(create_app(first, served_model_name=FAMILIES[0], extra_engines=engines)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _normalized(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("family", EMBEDDERS)
def test_openai_embeddings_are_llama_cpp_pooled(client: openai.OpenAI, family: str) -> None:
    gold = _golden(family)
    seqs = _split(gold["ids"], gold["lengths"])
    r = client.embeddings.create(model=family, input=seqs)            # base64 on the wire (the client's default)
    got = np.array([d.embedding for d in r.data])
    assert r.usage.prompt_tokens == sum(map(len, seqs))
    np.testing.assert_allclose(got, _normalized(gold["pooled"]), atol=TOL.get(family, 1e-5))
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("family", ["nomic-bert", "qwen3_embed"])
def test_matryoshka_dimensions(client: openai.OpenAI, family: str) -> None:
    gold = _golden(family)
    seqs = _split(gold["ids"], gold["lengths"])
    r = client.embeddings.create(model=family, input=seqs, dimensions=16)
    np.testing.assert_allclose(np.array([d.embedding for d in r.data]), _normalized(gold["pooled"][:, :16]),
                               atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=family, input="hello", dimensions=65)


@pytest.mark.parametrize("family", ["bert", "nomic-bert-moe"])
def test_text_inputs_use_the_files_tokenizer(server: LiveServer, client: openai.OpenAI, family: str) -> None:
    """A text input is embedded as llama.cpp tokenizes it (WordPiece [CLS] ... [SEP], unigram <s> ... </s>):
    the same vector as its ids; LangChain's OllamaEmbeddings (/api/embed) gets the same vectors."""
    from langchain_ollama import OllamaEmbeddings

    gold = _golden(family)
    text_ids = _split(gold["text_ids"], gold["text_lengths"])
    by_text = client.embeddings.create(model=family, input=TEXTS, encoding_format="float")
    by_ids = client.embeddings.create(model=family, input=text_ids, encoding_format="float")
    assert [d.embedding for d in by_text.data] == [d.embedding for d in by_ids.data]
    lc = OllamaEmbeddings(model=family, base_url=server.url)
    np.testing.assert_allclose(lc.embed_documents(TEXTS), [d.embedding for d in by_ids.data], atol=1e-6)
    np.testing.assert_allclose(lc.embed_query(TEXTS[0]), by_ids.data[0].embedding, atol=1e-6)


@pytest.mark.parametrize("family", RERANKERS)
def test_rerank_matches_llama_server(server: LiveServer, family: str) -> None:
    gold = _golden(family)
    ref = gold["rerank_pooled"][:, 0]
    for path in ("/v1/rerank", "/rerank"):
        r = httpx.post(server.url + path, json={"model": family, "query": QUERY, "documents": DOCS, "top_n": 2,
                                                "return_documents": True}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        scores = [x["relevance_score"] for x in body["results"]]
        assert len(scores) == 2 and scores == sorted(scores, reverse=True)   # top_n, best first (bert_rank's
        # tiny docs 1 and 2 are within llama.cpp's fp16-GELU rounding of each other: the order is not asserted)
        for x in body["results"]:
            assert x["relevance_score"] == pytest.approx(float(ref[x["index"]]), abs=TOL.get(family, 1e-5))
            assert x["document"] == {"text": DOCS[x["index"]]}
        assert body["usage"]["total_tokens"] == int(gold["rerank_lengths"].sum())
    tei = httpx.post(server.url + "/rerank", json={"model": family, "query": QUERY, "texts": DOCS}, timeout=60).json()
    assert sorted(x["index"] for x in tei) == [0, 1, 2] and all("score" in x for x in tei)


@pytest.mark.parametrize("family", RERANKERS)
def test_rerank_tokens_are_llama_servers(server: LiveServer, family: str, tmp_path: Path) -> None:
    from hitenter.tokenizer import Tokenizer

    gold = _golden(family)
    tok = Tokenizer.from_gguf(write_tiny_encoder(tmp_path / "t.gguf", family))
    from hitenter.tokenizer.gguf_meta import read_tokenizer_metadata

    template = read_tokenizer_metadata(tmp_path / "t.gguf").get("tokenizer.chat_template.rerank")
    assert [rerank_tokens(tok, template, QUERY, d) for d in DOCS] == _split(gold["rerank_ids"], gold["rerank_lengths"])


def test_vllm_score(server: LiveServer) -> None:
    ref = _golden("bert_rank")["rerank_pooled"][:, 0]
    r = httpx.post(server.url + "/score", json={"model": "bert_rank", "text_1": QUERY, "text_2": DOCS}, timeout=60)
    assert r.status_code == 200, r.text
    assert [d["score"] for d in r.json()["data"]] == pytest.approx(ref.tolist(), abs=2e-3)
    pairwise = httpx.post(server.url + "/v1/score", json={"model": "bert_rank", "text_1": [QUERY, QUERY],
                                                          "text_2": DOCS[:2]}, timeout=60).json()
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(ref[:2].tolist(), abs=2e-3)
    bad = httpx.post(server.url + "/score", json={"model": "bert_rank", "text_1": [QUERY], "text_2": DOCS})
    assert bad.status_code == 400 and "text_2" in bad.text


def test_embedding_model_scores_by_cosine(server: LiveServer, client: openai.OpenAI) -> None:
    r = httpx.post(server.url + "/v1/rerank", json={"model": "nomic-bert", "query": QUERY, "documents": DOCS},
                   timeout=60).json()
    vecs = np.array([d.embedding for d in client.embeddings.create(model="nomic-bert", input=[QUERY, *DOCS]).data])
    cos = vecs[1:] @ vecs[0]
    assert {x["index"]: x["relevance_score"] for x in r["results"]} == pytest.approx(dict(enumerate(cos)), abs=1e-5)


def test_refusals(server: LiveServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model="bert", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model="nomic-bert", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="rerank"):
        client.embeddings.create(model="bert_rank", input="hello")
    for body in ({"model": "bert_rank", "query": QUERY}, {"model": "bert_rank", "query": QUERY, "documents": []},
                 {"model": "bert_rank", "query": QUERY, "documents": DOCS, "top_n": 0},
                 {"model": "bert_rank", "query": QUERY, "documents": DOCS, "rank_fields": ["x"]}):
        r = httpx.post(server.url + "/v1/rerank", json=body)
        assert r.status_code == 400, (body, r.text)
