"""Serving benchmark: N concurrent streaming clients against hitenter (and optionally llama.cpp).

Each client sends requests one after another over /v1/completions with ``stream: true``; prompts and
output lengths are fixed by ``--seed`` (random words, ``--input-len`` words long; ``max_tokens =
--output-len`` with ``ignore_eos`` so every request generates the same number of tokens). Per
concurrency level it prints output tokens/s (all clients together), p50/p99 time to first token and
p50/p99 inter-token latency.

    .venv/bin/python bench/serving.py                       # SmolLM2, N = 1, 8, 32, `hitenter serve` started here
    .venv/bin/python bench/serving.py -c 1,4 --output-len 32 --requests-per-client 2     # quick smoke
    .venv/bin/python bench/serving.py --url http://127.0.0.1:8000       # an already running hitenter
    .venv/bin/python bench/serving.py --llama-server http://127.0.0.1:8081          # plus the baseline
    .venv/bin/python bench/serving.py --llama-server-bin /work/llama-server/.../bin/llama-server
    .venv/bin/python bench/serving.py --temperature 1 ...             # sampled, as OpenAI's default
    .venv/bin/python bench/serving.py --model /work/models/qwen35-2b-syn.gguf -c 16 --requests-per-client 1 \
        --input-len 48 --output-len 32 --num-threads 2 --rounds 3 \
        --llama-server-bin PATH --llama-server-arg=--no-repack       # 16 streams on the Qwen3.5-2B shape

The baseline is not a dependency of hitenter or its tests. Either
  * llama.cpp's own server: ``git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp &&
    cmake -B build -DGGML_NATIVE=ON && cmake --build build -j --target llama-server``, then
    ``build/bin/llama-server -m ~/.cache/hitenter/models/smollm2-135m-instruct.gguf -t 2 -np 32 -c 32768
    --port 8081`` (``-np`` slots >= the largest N, ``-c`` = slots x per-request context), or
  * llama-cpp-python: ``pip install 'llama-cpp-python[server]'`` (builds llama.cpp), then
    ``python -m llama_cpp.server --model <same gguf> --n_threads 2 --n_ctx 2048 --port 8081``
    (it serves one request at a time, so its numbers at N > 1 measure queueing).
Pass its URL with ``--llama-server``; both are measured with the same load and the ratio is printed.
Or pass the binary with ``--llama-server-bin`` (``bash bench/build_llama_server.sh`` builds it from the
llama.cpp vendored in llama-cpp-python): for each N it is started on the same GGUF with ``--parallel N``
and ``-c N x --llama-server-ctx``, measured, and stopped (see bench/llama_server.py).

With a baseline, each N is measured in ``--rounds`` alternating rounds (hitenter then llama.cpp, then the
other way round, both servers up, each round new prompts so neither server's prompt cache serves them);
every measurement prints the load average beside it, and the ratios are of the rounds' medians (the
per-round ratios are printed too). On a shared machine the load average says how much a figure is worth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import FORMATS  # noqa: E402
from llama_server import LlamaServer, ServerProcess  # noqa: E402

WORDS = ("the cat dog house tree river mountain city music light water fire stone road cloud garden "
         "story window table morning evening summer winter quiet bright small large old new green").split()


@dataclass
class Result:
    ttft: float
    itl: list[float]
    n_tokens: int


@dataclass
class Level:
    concurrency: int
    wall: float
    results: list[Result] = field(default_factory=list)
    errors: int = 0

    def row(self) -> dict[str, float]:
        toks = sum(r.n_tokens for r in self.results)
        ttft = sorted(r.ttft for r in self.results) or [float("nan")]
        itl = sorted(x for r in self.results for x in r.itl) or [float("nan")]
        return {"N": self.concurrency, "requests": len(self.results), "errors": self.errors,
                "tok_s": toks / self.wall if self.wall > 0 else float("nan"),
                "ttft_p50_ms": 1000 * _pct(ttft, 50), "ttft_p99_ms": 1000 * _pct(ttft, 99),
                "itl_p50_ms": 1000 * _pct(itl, 50), "itl_p99_ms": 1000 * _pct(itl, 99)}


def _pct(xs: list[float], p: float) -> float:
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1] if p < 100 else xs[-1]


def make_prompts(n: int, input_len: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(input_len)) for _ in range(n)]


async def one_request(client: httpx.AsyncClient, url: str, model: str | None, prompt: str, output_len: int,
                      api_key: str | None, temperature: float = 0.0) -> Result:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": output_len, "temperature": temperature, "stream": True,
                            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    t0 = time.perf_counter()
    times: list[float] = []
    usage_tokens = None
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"]))
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
            if any(c.get("text") for c in chunk.get("choices") or []):
                times.append(time.perf_counter())
    if not times:
        raise RuntimeError("no tokens streamed")
    n = usage_tokens or len(times)
    return Result(times[0] - t0, [b - a for a, b in zip(times, times[1:], strict=False)], n)


async def run_level(url: str, model: str | None, n: int, prompts: list[str], output_len: int,
                    api_key: str | None, temperature: float = 0.0) -> Level:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    level = Level(n, 0.0)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            p = queue.get_nowait()
            try:
                level.results.append(await one_request(client, url, model, p, output_len, api_key,
                                                                temperature))
            except Exception as e:  # noqa: BLE001 -- counted and reported
                level.errors += 1
                print(f"  request failed: {e}", file=sys.stderr)

    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(n)))
        level.wall = time.perf_counter() - t0
    return level


def load_average() -> str:
    """The 1 / 5 / 15-minute load averages, as `uptime` prints them."""
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def warm_up(url: str, args: argparse.Namespace) -> None:
    """One short request (first-call costs)."""
    asyncio.run(run_level(url, None, 1, make_prompts(1, args.input_len, args.seed + 999), 4, args.api_key))


def measure(url: str, n: int, prompts: list[str], args: argparse.Namespace, label: str) -> dict[str, float]:
    """One level: `n` clients over `prompts`; prints its row with the load average after it."""
    row = asyncio.run(run_level(url, None, n, prompts, args.output_len, args.api_key, args.temperature)).row()
    print(f"{label:10s} N={n:<3d} reqs={row['requests']:<4.0f} err={row['errors']:<2.0f} "
          f"{row['tok_s']:8.1f} tok/s  TTFT p50 {row['ttft_p50_ms']:8.1f} p99 {row['ttft_p99_ms']:8.1f} ms  "
          f"ITL p50 {row['itl_p50_ms']:7.1f} p99 {row['itl_p99_ms']:7.1f} ms  {load_average()}", flush=True)
    return row


def bench(url: str, model: str | None, levels: list[int], args: argparse.Namespace, label: str) -> list[dict[str, float]]:
    warm_up(url, args)
    return [measure(url, n, make_prompts(n * args.requests_per_client, args.input_len, args.seed + n), args, label)
            for n in levels]


def llama_server(n: int, args: argparse.Namespace) -> LlamaServer:
    """The llama-server binary on hitenter's GGUF with ``--parallel n`` (not started)."""
    from hitenter.models.registry import resolve_model

    # Words of the prompt are ~1-2 tokens each; leave room for the template-free prompt + output.
    per_slot = args.llama_server_ctx or -(-(2 * args.input_len + args.output_len + 64) // 256) * 256
    return LlamaServer(args.llama_server_bin, resolve_model(args.model), parallel=n, ctx_per_slot=per_slot,
                       threads=args.num_threads or 2, startup_timeout=args.llama_server_timeout,
                       extra_args=tuple(args.llama_server_arg))


def _median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def alternate(url: str, n: int, base_url: str, args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    """`--rounds` rounds of level `n` on both servers, the order swapped every round, fresh prompts each
    round; (hitenter's, llama.cpp's) medians over the rounds."""
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    warm_up(url, args)
    warm_up(base_url, args)
    for r in range(args.rounds):
        prompts = make_prompts(n * args.requests_per_client, args.input_len, args.seed + n + 1000 * (r + 1))
        sides = [(url, "hitenter", ours), (base_url, "llama.cpp", theirs)]
        for u, label, rows in sides if r % 2 == 0 else sides[::-1]:
            rows.append(measure(u, n, prompts, args, label))
        print(f"  round {r}: N={n} throughput ratio {ours[-1]['tok_s'] / theirs[-1]['tok_s']:.2f}  TTFT p50 ratio "
              f"{ours[-1]['ttft_p50_ms'] / theirs[-1]['ttft_p50_ms']:.2f}", flush=True)
    return _median_row(ours), _median_row(theirs)


def bench_pair(url: str, levels: list[int], args: argparse.Namespace) -> tuple[list[dict[str, float]],
                                                                               list[dict[str, float]]]:
    """Each level on hitenter (at `url`) and the baseline in alternating rounds (a llama-server binary is
    started per level with ``--parallel N``)."""
    ours, theirs = [], []
    for n in levels:
        if args.llama_server_bin:
            with llama_server(n, args) as srv:
                a, b = alternate(url, n, srv.url, args)
        else:
            a, b = alternate(url, n, args.llama_server.rstrip("/"), args)
        ours.append(a)
        theirs.append(b)
    return ours, theirs


class HitenterServer(ServerProcess):
    """`hitenter serve` in its own process, as llama-server runs in its own: the benchmark's clients
    then share the CPUs with the server, not its interpreter lock."""

    name = "hitenter"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(startup_timeout=300.0)
        self.args = args

    def command(self) -> list[str]:
        a = self.args
        cmd = [sys.executable, "-m", "hitenter.cli", "serve", "--model", a.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--max-model-len", str(a.max_model_len)]
        for key, value in FORMATS[a.format].items():
            cmd += [f"--{key}", value]
        if a.num_threads:
            cmd += ["--num-threads", str(a.num_threads)]
        if a.fresh_tokens is not None:
            cmd += ["--fresh-tokens", str(a.fresh_tokens)]
        return cmd


def start_hitenter(args: argparse.Namespace) -> tuple[str, Any]:
    if args.in_process:
        from hitenter.engine.llm_engine import LLMEngine
        from hitenter.server.api import create_app
        from hitenter.testing.live_server import LiveServer

        kw: dict[str, Any] = {"max_model_len": args.max_model_len, **FORMATS[args.format]}
        if args.num_threads:
            kw["num_threads"] = args.num_threads
        t0 = time.perf_counter()
        engine = LLMEngine(args.model, **kw)
        print(f"loaded {args.model} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        srv = LiveServer(create_app(engine)).start()
        return srv.url, srv
    proc = HitenterServer(args).start()
    return proc.url, proc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("-c", "--concurrency", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=128, help="prompt length in words")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="every request's temperature (0: greedy; OpenAI's default is 1)")
    ap.add_argument("--format", default="gguf", choices=sorted(FORMATS),
                    help="hitenter's weight format (not with --url)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--fresh-tokens", type=int, default=None, help="the server's --fresh-tokens (0: no fresh lane)")
    ap.add_argument("--url", default=None, help="benchmark an already running hitenter server")
    ap.add_argument("--in-process", action="store_true",
                    help="run hitenter's server in this process (default: `hitenter serve` in its own, as llama-server)")
    ap.add_argument("--api-key", default=None)
    base = ap.add_mutually_exclusive_group()
    base.add_argument("--llama-server", default=None, help="URL of a llama.cpp / llama-cpp-python server")
    base.add_argument("--llama-server-bin", default=None, metavar="PATH",
                      help="llama-server binary to start per N (--parallel N) on the same GGUF")
    ap.add_argument("--llama-server-ctx", type=int, default=None,
                    help="per-slot context for --llama-server-bin (default: fits prompt + output)")
    ap.add_argument("--llama-server-arg", action="append", default=[],
                    help="an extra llama-server argument (repeatable), e.g. --no-repack where its repacked CPU "
                         "buffers crash (seen on AVX-512 + AMX machines with this llama.cpp)")
    ap.add_argument("--llama-server-timeout", type=float, default=120.0,
                    help="seconds to wait for --llama-server-bin's /health")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with a baseline: alternating rounds per N (medians reported)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.rounds < 1:
        ap.error(f"--rounds: must be >= 1, got {args.rounds}")
    if args.llama_server_bin and not os.access(Path(args.llama_server_bin).expanduser(), os.X_OK):
        ap.error(f"--llama-server-bin: not an executable file: {args.llama_server_bin} "
                 "(build it with bench/build_llama_server.sh)")
    srv = None
    url = args.url
    print(f"start: {load_average()}", flush=True)
    if url is None:
        url, srv = start_hitenter(args)
    try:
        if args.llama_server or args.llama_server_bin:
            ours, theirs = bench_pair(url, levels, args)
        else:
            ours, theirs = bench(url, None, levels, args, "hitenter"), []
    finally:
        if srv is not None:
            srv.stop()
    out: dict[str, Any] = {"hitenter": ours}
    if theirs:
        out["llama.cpp"] = theirs
        for a, b in zip(ours, theirs, strict=True):
            ratio = a["tok_s"] / b["tok_s"] if b["tok_s"] else float("nan")
            print(f"N={a['N']:<3.0f} medians of {args.rounds} rounds: hitenter {a['tok_s']:.2f} vs llama.cpp "
                  f"{b['tok_s']:.2f} tok/s, throughput ratio {ratio:.2f}; TTFT p50 {a['ttft_p50_ms']:.0f} vs "
                  f"{b['ttft_p50_ms']:.0f} ms, ratio {a['ttft_p50_ms'] / b['ttft_p50_ms']:.2f}")
    print(f"end: {load_average()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
