"""Engine I/O under load: does a busy engine starve new requests, metrics reads and aborts?

    python bench/starvation.py [--model smollm2-135m-instruct] [--streams 16] [--rounds 3] [--fresh-tokens N]

Starts ``hitenter serve`` (a subprocess) and measures, side by side in one run:
- idle: a 4-token completion's latency (median of --rounds);
- loaded: the same request while --streams streaming clients decode 256 tokens each (ignore_eos),
  sent 1 s after they started; its latency over the idle one (goal: <= 3x), and the streams' tokens/s
  meanwhile (what the fresh lane, hitenter/engine/fresh_lane.py, costs them; --fresh-tokens 0: off);
- /metrics latency while loaded (p50 / p99 over 50 reads; goal p99 < 100 ms);
- an aborted stream (client closes it): the running requests in /metrics one second later.
Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx

from hitenter.testing.serve import serve_subprocess

SHORT = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
LONG = {"prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 256, "temperature": 0.8,
        "ignore_eos": True, "stream": True}


def timed(c: httpx.Client, body: dict) -> float:
    t = time.perf_counter()
    r = c.post("/v1/completions", json=body)
    r.raise_for_status()
    return time.perf_counter() - t


def stream_one(url: str, stop: threading.Event, abort_after: float | None = None,
               arrivals: list[float] | None = None) -> None:
    with httpx.Client(base_url=url, timeout=600) as c, c.stream("POST", "/v1/completions", json=LONG) as r:
        t0 = time.monotonic()
        for line in r.iter_lines():
            if arrivals is not None and line.startswith("data: {"):
                arrivals.append(time.monotonic())
            if stop.is_set() or (abort_after is not None and time.monotonic() - t0 > abort_after):
                return


def running(c: httpx.Client) -> float:
    text = c.get("/metrics").text
    vals = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("hitenter:num_requests_running")]
    return sum(vals)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fresh-tokens", type=int, default=None)
    a = ap.parse_args()
    extra = [] if a.fresh_tokens is None else ["--fresh-tokens", str(a.fresh_tokens)]
    with serve_subprocess(["--model", a.model, "--metrics-public", *extra]) as (url, _), \
            httpx.Client(base_url=url, timeout=600) as c:
        timed(c, SHORT)                                              # warm-up
        idle = statistics.median(timed(c, SHORT) for _ in range(a.rounds))
        stop = threading.Event()
        arrivals: list[float] = []    # the streams' chunks (one token each), for their throughput
        threads = [threading.Thread(target=stream_one, args=(url, stop, None, arrivals), daemon=True)
                   for _ in range(a.streams)]
        threads.append(threading.Thread(target=stream_one, args=(url, stop, 2.0), daemon=True))   # aborts at 2 s
        for t in threads:
            t.start()
        time.sleep(1.0)
        w0 = time.monotonic()
        loaded = statistics.median(timed(c, SHORT) for _ in range(a.rounds))
        w1 = time.monotonic()
        lat = []
        for _ in range(50):
            t = time.perf_counter()
            c.get("/metrics").raise_for_status()
            lat.append(time.perf_counter() - t)
        time.sleep(max(0.0, 3.5 - 1.0))
        run_after_abort = running(c)
        stop.set()
    lat.sort()
    res = {"idle_s": idle, "loaded_s": loaded, "ratio": loaded / idle, "metrics_p50_ms": 1e3 * lat[len(lat) // 2],
           "metrics_p99_ms": 1e3 * lat[int(0.99 * (len(lat) - 1))], "running_after_abort": run_after_abort,
           "streams": a.streams,
           "streams_tok_s": sum(w0 <= t < w1 for t in arrivals) / (w1 - w0)}
    print(f"4-token request: idle {idle * 1e3:.0f} ms, with {a.streams} streams decoding {loaded * 1e3:.0f} ms "
          f"({res['ratio']:.2f}x; goal <= 3x)")
    print(f"the {a.streams} streams while the short requests ran: {res['streams_tok_s']:.0f} tok/s")
    print(f"/metrics while loaded: p50 {res['metrics_p50_ms']:.1f} ms, p99 {res['metrics_p99_ms']:.1f} ms "
          "(goal p99 < 100 ms)")
    print(f"running requests 1.5 s after one of {a.streams + 1} streams was closed: {run_after_abort:.0f} "
          f"(expected {a.streams})")
    print("JSON", json.dumps({"bench": "starvation", **res}))


if __name__ == "__main__":
    main()
