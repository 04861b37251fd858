"""Chat streams beside a rerank batch on one server: do the streams keep their rate while 256 documents are
reranked, and how long does the rerank take meanwhile?

    .venv/bin/python bench/rerank_beside_chat.py [--model smollm2-135m-instruct] [--streams 16] [--rounds 2]
        [--reranker FILE.gguf]

One ``hitenter serve`` with the chat model and a reranker (``--extra-model``; default the bge-reranker-shaped
synthetic file of bench/embeddings.py: bert 12 x 384 with bge-reranker's classifier head, F32). Per round, in
alternating order: ``alone``, --streams streaming completions (256 tokens, ignore_eos) for --window seconds,
their tokens per second (SSE chunks) counted after a 2 s warm-up; ``beside``, the same while 8 /v1/rerank
requests of 1 query x 32 documents (8-200 words) run back to back, the streams' rate counted over the
rerank's span. The window (default 60 s) must hold several of each stream's 256-token cycles, as the
rerank's span does: over the first 10 s the streams all sit early in their first cycle (short contexts, no
new prompts), 1.2x their steady rate, which read as a loss beside the rerank. Prints medians, the ratio beside / alone (goal >= 0.8) and the rerank's time alone and beside
the streams, with ``uptime`` per round (other work may share the machine).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import emit_json, table  # noqa: E402
from embeddings import model_file, texts  # noqa: E402

from hitenter.testing.serve import serve_subprocess  # noqa: E402

LONG = {"prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 256, "temperature": 0.8,
        "ignore_eos": True, "stream": True}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def stream(url: str, model: str, stop: threading.Event, arrivals: list[float]) -> None:
    while not stop.is_set():
        with httpx.Client(base_url=url, timeout=600) as c, \
                c.stream("POST", "/v1/completions", json={**LONG, "model": model}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())
                if stop.is_set():
                    return


def rerank_all(url: str, model: str, batches: list[list[str]]) -> float:
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=600) as c:
        for docs in batches:
            r = c.post("/v1/rerank", json={"model": model, "query": "what is the capital of france?",
                                           "documents": docs})
            r.raise_for_status()
    return time.monotonic() - t0


def rate(arrivals: list[float], t0: float, t1: float) -> float:
    return sum(t0 <= a < t1 for a in arrivals) / max(1e-9, t1 - t0)


def streams_rate(url: str, chat: str, n: int, window: float | None, rerank: tuple[str, list[list[str]]] | None
                 ) -> tuple[float, float | None]:
    """(the streams' tokens/s, the rerank's seconds or None): over `window` s, or over the rerank's span."""
    stop, arrivals = threading.Event(), []
    threads = [threading.Thread(target=stream, args=(url, chat, stop, arrivals), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    t0 = time.monotonic()
    took = None
    if rerank is not None:
        took = rerank_all(url, *rerank)
    else:
        time.sleep(window or 10.0)
    t1 = time.monotonic()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    return rate(arrivals, t0, t1), took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--reranker", type=Path, default=None)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    files = Path(tempfile.gettempdir()) / "hitenter-bench-embeddings"
    files.mkdir(parents=True, exist_ok=True)
    reranker = a.reranker or model_file("bge-small", None, files, rank=True)
    rng = random.Random(0)
    batches = [texts(rng, 32, 8, 200) for _ in range(8)]
    with serve_subprocess(["--model", a.model, "--extra-model", str(reranker), "--num-threads", str(a.threads)]
                          ) as (url, _):
        names = [m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]]
        chat, rank = names[0], next(n for n in names if n != names[0] and "trigram" not in n)
        alone_rerank = rerank_all(url, rank, batches)          # warm-up, and the rerank's time alone
        alone, beside, beside_rerank = [], [], []
        print(f"rerank alone: {alone_rerank:.1f} s; {uptime()}", file=sys.stderr)
        for rnd in range(a.rounds):
            for kind in (("alone", "beside") if rnd % 2 == 0 else ("beside", "alone")):
                r, took = streams_rate(url, chat, a.streams, a.window,
                                       (rank, batches) if kind == "beside" else None)
                (alone if kind == "alone" else beside).append(r)
                if took is not None:
                    beside_rerank.append(took)
                print(f"round {rnd + 1} {kind}: streams {r:.1f} tok/s" + (f", rerank {took:.1f} s" if took else "")
                      + f"; {uptime()}", file=sys.stderr, flush=True)
    ra, rb = statistics.median(alone), statistics.median(beside)
    print(table([[a.streams, f"{ra:.1f}", f"{rb:.1f}", f"{rb / ra:.2f}", f"{alone_rerank:.1f}",
                  f"{statistics.median(beside_rerank):.1f}"]],
                ["streams", "tok/s alone", "tok/s beside rerank", "ratio", "rerank alone s", "rerank beside s"]))
    emit_json("rerank_beside_chat", {"model": a.model, "reranker": str(reranker), "streams": a.streams,
                                     "alone": alone, "beside": beside, "ratio": rb / ra, "rerank_alone_s": alone_rerank,
                                     "rerank_beside_s": beside_rerank, "uptime_after": uptime()})


if __name__ == "__main__":
    main()
