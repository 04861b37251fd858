"""Embedding and rerank throughput: hitenter vs llama-server on the same GGUF, same run, alternating rounds.

    .venv/bin/python bench/embeddings.py [--shape bge-small|qwen3-embedding-0.6b] [--quant Q8_0]
        [--llama-server-bin PATH] [--rounds 3] [--threads 2] [--workloads short,mixed,long,rerank]

Files: synthetic GGUFs of a realistic shape written with llama.cpp's tensor names and metadata:
``bge-small`` (hitenter.testing.tiny_encoders with its shape constants set: bert, 12 layers, hidden 384,
12 heads, ffn 1536, context 512, CLS pooling, the tiny WordPiece vocabulary; its reranker twin adds
bge-reranker's classifier head; ``--quant`` puts the layers' matrices in a GGML type, default F32) or
``qwen3-embedding-0.6b`` (bench/synthetic_qwen3_embedding.py: Qwen3-Embedding-0.6B's config, qwen3, 28
layers, hidden 1024, 16 / 8 heads of 128, ffn 3072, vocab 151669 from the Qwen2.5 BPE vocabulary,
last-token pooling with <|endoftext|> appended; the reranker twin is Qwen3-Reranker-shaped; ``--quant``
Q8_0 by default, or F16, the types the real files ship in). Weights random.

Workloads, each over HTTP, one request at a time, the servers in turn (order alternating per round):
- ``short``: 256 short texts (6-16 words) as 8 /v1/embeddings requests of 32;
- ``mixed``: 256 documents of mixed length (8-200 words) as 8 requests of 32;
- ``long``: 4 texts of ~450 words in one request;
- ``rerank``: 1 query x 32 documents (8-200 words) on /v1/rerank, with the reranker twin.
Tokens per second count hitenter's ``usage.prompt_tokens`` (llama-server's is printed beside it: the same
tokenizer gives the same count). llama-server runs with ``--embedding`` / ``--reranking``, ``--no-repack``
(this llama.cpp crashes on AMX machines with repacked buffers), ``-np 32`` and its default batch sizes;
both servers get ``--threads`` threads. Medians over rounds and their ratio (hitenter / llama-server);
``uptime`` before and after, since other work may share the machine (ggml's worker threads spin while
they wait, so llama-server loses more than hitenter on a loaded machine: compare on a quiet one). The
first round also prints how far the servers' vectors agree (cosine) as a sanity check only: the tiny
files' random weight scales make a 12- or 28-layer stack amplify rounding (ggml's fp16 GELU table);
correctness is tests/models/families/test_encoders.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import synthetic_qwen3_embedding  # noqa: E402
from common import emit_json, table  # noqa: E402
from llama_server import LlamaServer, ServerProcess  # noqa: E402

from hitenter.testing import tiny_encoders  # noqa: E402

DEFAULT_BIN = "/work/llama-server/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
SHAPES: dict[str, dict[str, Any]] = {
    "bge-small": {"families": ("bert", "bert_rank"), "HIDDEN": 384, "HEADS": 12, "FFN": 1536, "CONTEXT": 512,
                  "LAYERS": 12},
    "qwen3-embedding-0.6b": {"families": ("embed", "rank"), "CONTEXT": 512},
}
REAL_SHAPE_QUANT = "Q8_0"       # qwen3-embedding-0.6b's default type: the real Q8_0 file's


@contextlib.contextmanager
def _shape(values: dict[str, Any]) -> Iterator[None]:
    keys = [k for k in values if k != "families"]
    old = {k: getattr(tiny_encoders, k) for k in keys}
    try:
        for k in keys:
            setattr(tiny_encoders, k, values[k])
        yield
    finally:
        for k, v in old.items():
            setattr(tiny_encoders, k, v)


def model_file(shape: str, quant: str | None, folder: Path, rank: bool) -> Path:
    """The embedding file of `shape` (`rank`: its reranker twin), written once per folder."""
    spec = SHAPES[shape]
    real = shape == "qwen3-embedding-0.6b"
    quant = quant or (REAL_SHAPE_QUANT if real else None)
    family = spec["families"][1 if rank else 0]
    path = folder / f"{shape}-{family}-{quant or 'F32'}.gguf"
    if not path.is_file():
        if real:
            synthetic_qwen3_embedding.write(path, family, synthetic_qwen3_embedding.default_tokenizer_source(),
                                            quant or REAL_SHAPE_QUANT)
        else:
            with _shape(spec):
                tiny_encoders.write_tiny_encoder(path, family, quant=quant)
    return path


def texts(rng: random.Random, n: int, lo: int, hi: int) -> list[str]:
    words = tiny_encoders.WORDS
    return [" ".join(rng.choice(words) for _ in range(rng.randint(lo, hi))) + "." for _ in range(n)]


class HitenterServer(ServerProcess):
    name = "hitenter"

    def __init__(self, model: Path, threads: int, ctx: int) -> None:
        super().__init__(300.0)
        self.model, self.threads, self.ctx = model, threads, ctx

    def command(self) -> list[str]:
        return [sys.executable, "-m", "hitenter.cli", "serve", "--model", str(self.model), "--host", "127.0.0.1",
                "--port", str(self.port), "--num-threads", str(self.threads), "--max-model-len", str(self.ctx)]


def served_model(url: str) -> str:
    return str(httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"])


def embed(url: str, batch: list[str]) -> tuple[np.ndarray, int]:
    r = httpx.post(url + "/v1/embeddings", json={"input": batch, "model": served_model(url)}, timeout=600)
    r.raise_for_status()
    body = r.json()
    vecs = np.array([d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])], dtype=np.float64)
    return vecs, int(body["usage"]["prompt_tokens"])


def rerank(url: str, query: str, docs: list[str]) -> tuple[np.ndarray, int]:
    r = httpx.post(url + "/v1/rerank", json={"model": served_model(url), "query": query, "documents": docs,
                                             "top_n": len(docs)}, timeout=600)
    r.raise_for_status()
    body = r.json()
    scores = np.zeros(len(docs))
    for item in body["results"]:
        scores[item["index"]] = item["relevance_score"]
    return scores, int((body.get("usage") or {}).get("prompt_tokens", 0))


def workloads(rng: random.Random) -> dict[str, Any]:
    return {"short": [texts(rng, 32, 6, 16) for _ in range(8)],
            "mixed": [texts(rng, 32, 8, 200) for _ in range(8)],
            "long": [texts(rng, 4, 440, 460)],
            "rerank": ("what is the capital of france?", texts(rng, 32, 8, 200))}


def run_one(url: str, name: str, work: Any) -> tuple[float, int, Any]:
    """(seconds, tokens, outputs) of one workload."""
    t0 = time.perf_counter()
    if name == "rerank":
        out, n = rerank(url, *work)
        return time.perf_counter() - t0, n, out
    outs, n = [], 0
    for batch in work:
        v, k = embed(url, batch)
        outs.append(v)
        n += k
    return time.perf_counter() - t0, n, np.concatenate(outs)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="bge-small")
    ap.add_argument("--quant", default=None, help="GGML type of the layers' matrices "
                    "(default F32; qwen3-embedding-0.6b: Q8_0)")
    ap.add_argument("--llama-server-bin", default=DEFAULT_BIN)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="short,mixed,long,rerank")
    ap.add_argument("--llama-extra", default="", help="more llama-server arguments, e.g. '--poll 0'")
    ap.add_argument("--files", type=Path, default=Path(tempfile.gettempdir()) / "hitenter-bench-embeddings")
    args = ap.parse_args()
    args.files.mkdir(parents=True, exist_ok=True)
    work = workloads(random.Random(0))
    names = args.workloads.split(",")
    ctx = SHAPES[args.shape]["CONTEXT"]
    times: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], int] = {}
    print("before:", uptime(), file=sys.stderr)
    for kind in ("embed", "rank"):
        todo = [n for n in names if (n == "rerank") == (kind == "rank")]
        if not todo:
            continue
        file = model_file(args.shape, args.quant, args.files, rank=kind == "rank")
        flag = "--reranking" if kind == "rank" else "--embedding"
        with HitenterServer(file, args.threads, ctx) as hs, \
             LlamaServer(args.llama_server_bin, file, parallel=32, ctx_per_slot=ctx, threads=args.threads,
                         extra_args=(flag, "--no-repack", *args.llama_extra.split())) as ls:
            for rnd in range(args.rounds):
                order = [("hitenter", hs.url), ("llama-server", ls.url)]
                for name in todo:
                    outs = {}
                    for who, url in order if rnd % 2 == 0 else order[::-1]:
                        s, n, out = run_one(url, name, work[name])
                        print(f"round {rnd + 1} {name} {who}: {n} tokens in {s:.2f} s", file=sys.stderr, flush=True)
                        times.setdefault((name, who), []).append(s)
                        tokens[(name, who)] = n
                        outs[who] = out
                    if rnd == 0:
                        a, b = outs["hitenter"], outs["llama-server"]
                        if name == "rerank":
                            agree = float(np.max(np.abs(a - b)) / max(1e-9, float(np.max(np.abs(b)))))
                            print(f"{name}: max |score diff| / max |score| = {agree:.2e}", file=sys.stderr)
                        else:
                            cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
                            print(f"{name}: min cosine hitenter vs llama-server = {cos.min():.6f}", file=sys.stderr)
                print(f"round {rnd + 1}: {uptime()}", file=sys.stderr)
    print("after:", uptime(), file=sys.stderr)
    rows, result = [], {"shape": args.shape, "quant": file.stem.rsplit("-", 1)[-1], "threads": args.threads,
                        "llama_extra": args.llama_extra,
                        "rounds": args.rounds, "uptime_after": uptime(), "workloads": {}}
    for name in names:
        th, tl = statistics.median(times[(name, "hitenter")]), statistics.median(times[(name, "llama-server")])
        n = tokens[(name, "hitenter")]
        rows.append([name, n, tokens[(name, "llama-server")], f"{n / th:.0f}", f"{n / tl:.0f}", f"{tl / th:.2f}"])
        result["workloads"][name] = {"tokens": n, "hitenter_s": th, "llama_server_s": tl, "ratio": tl / th}
    print(table(rows, ["workload", "tokens", "tokens (llama)", "hitenter tok/s", "llama-server tok/s",
                       "ratio"]))
    emit_json("embeddings", result)


if __name__ == "__main__":
    main()
