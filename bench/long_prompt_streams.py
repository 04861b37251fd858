"""A long prompt arriving while streams decode: what it costs them, and what they cost it.

    .venv/bin/python bench/long_prompt_streams.py [--model smollm2-135m-instruct] [--streams 16]
        [--prompt-tokens 4000] [--rounds 2] [--fresh-tokens N] [--side-prefill-tokens N]

Starts ``hitenter serve`` (a subprocess; prefix caching stays on, so every long prompt starts with its own
token and never hits the cache) and measures in one run:
- alone: the long prompt's time to first token with nothing else running (median of --rounds);
- the --streams streaming clients' output tokens/s on their own, in windows as long as the prompt's TTFT
  alone (at least 5 s) just before and just after each long prompt (their rate falls as their contexts
  grow, so the two windows bracket it), and while the long prompt is being prefilled (from its arrival to
  its first token);
- the long prompt's TTFT while the streams decode.
Goals (issue 29): the streams keep >= 0.5x their rate; the prompt's TTFT <= 2x alone. Also prints the two
shares' sum (streams ratio + alone / beside TTFT): time-sharing alone gives 1.0, so both goals need >= 1.0
and a split near half and half (hitenter/engine/prefill_pacing.py). Prints the CPU and ISA and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line  # noqa: E402

from hitenter.testing.serve import serve_subprocess  # noqa: E402

STREAM = {"prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 4096, "temperature": 0.8,
          "ignore_eos": True, "stream": True}


def long_prompt(n: int, salt: int) -> list[int]:
    """n token ids; the first differs per call so no two share a cached prefix."""
    return [1000 + salt] + [100 + (i * 7919) % 40000 for i in range(n - 1)]


def ttft(url: str, n: int, salt: int) -> float:
    """Seconds from sending an n-token prompt to its first streamed token."""
    body = {"prompt": long_prompt(n, salt), "max_tokens": 2, "temperature": 0, "stream": True}
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=1200) as c, c.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.monotonic() - t0
    raise RuntimeError("the long prompt produced no token")


def stream_one(url: str, stop: threading.Event, arrivals: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=1200) as c, c.stream("POST", "/v1/completions", json=STREAM) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
            if stop.is_set():
                return


def rate(arrivals: list[float], t0: float, t1: float) -> float:
    return sum(t0 <= t < t1 for t in arrivals) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fresh-tokens", type=int, default=None)
    ap.add_argument("--side-prefill-tokens", type=int, default=None,
                    help="the server's option (0: the prompt is only paced beside the streams, no side prefill)")
    a = ap.parse_args()
    extra = [] if a.fresh_tokens is None else ["--fresh-tokens", str(a.fresh_tokens)]
    if a.side_prefill_tokens is not None:
        extra += ["--side-prefill-tokens", str(a.side_prefill_tokens)]
    args = ["--model", a.model, "--max-model-len", str(max(8192, a.prompt_tokens + 64)), *extra]
    print(cpu_line(), f"| model {a.model} | {a.streams} streams | prompt {a.prompt_tokens} tokens | "
          f"server options {' '.join(extra) or '(defaults)'}")
    with serve_subprocess(args, startup_s=300) as (url, _):
        ttft(url, 64, 0)                                                      # warm-up
        alone = statistics.median(ttft(url, a.prompt_tokens, r + 1) for r in range(a.rounds))
        stop = threading.Event()
        arrivals: list[float] = []
        threads = [threading.Thread(target=stream_one, args=(url, stop, arrivals), daemon=True)
                   for _ in range(a.streams)]
        for t in threads:
            t.start()
        time.sleep(3.0)                                                       # every stream admitted
        window = max(5.0, alone)
        w0 = time.monotonic()
        time.sleep(window)
        w1 = time.monotonic()
        rows = []
        for r in range(a.rounds):
            loaded = ttft(url, a.prompt_tokens, 100 + r)
            w2 = time.monotonic()
            time.sleep(window)                                                # after: the next round's before
            w3 = time.monotonic()
            rows.append((rate(arrivals, w0, w1), rate(arrivals, w1, w2), loaded, rate(arrivals, w2, w3)))
            w0, w1 = w2, w3
        stop.set()
    before = statistics.median(x[0] for x in rows)
    after = statistics.median(x[3] for x in rows)
    during = statistics.median(x[1] for x in rows)
    loaded = statistics.median(x[2] for x in rows)
    own = statistics.median((x[0] + x[3]) / 2 for x in rows)   # their rate without the prompt, bracketing it
    res = {"model": a.model, "streams": a.streams, "server_options": extra, "prompt_tokens": a.prompt_tokens, "ttft_alone_s": alone,
           "ttft_loaded_s": loaded, "ttft_ratio": loaded / alone, "streams_tok_s": own,
           "streams_tok_s_before": before, "streams_tok_s_after": after,
           "streams_tok_s_during_prefill": during, "streams_ratio": during / own if own else 0.0,
           "streams_ratio_vs_before": during / before if before else 0.0}
    res["shares_sum"] = res["streams_ratio"] + alone / loaded
    print(f"{a.prompt_tokens}-token prompt TTFT: alone {alone:.2f} s, beside {a.streams} streams {loaded:.2f} s "
          f"({res['ttft_ratio']:.2f}x; goal <= 2x)")
    print(f"{a.streams} streams: {own:.1f} tok/s on their own ({before:.1f} before the prompt, {after:.1f} after), "
          f"{during:.1f} tok/s while it was prefilled ({res['streams_ratio']:.2f}x; goal >= 0.5x; "
          f"{res['streams_ratio_vs_before']:.2f}x of the rate before)")
    print(f"shares: streams {res['streams_ratio']:.2f} + prompt {alone / loaded:.2f} = {res['shares_sum']:.2f}")
    print("JSON", json.dumps({"bench": "long_prompt_streams", **res}))


if __name__ == "__main__":
    main()
