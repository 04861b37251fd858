"""Disaggregated prefill: TTFT and inter-token latency of a stream of short requests while long prompts arrive.

    .venv/bin/python bench/disaggregated.py [--model smollm2-135m-instruct] [--long-tokens 1500] [--seconds 8]

Open loop, one engine driven from this thread: a short request (~20-token prompt, 32 tokens out) arrives
every `--gap-ms`, and a long prompt (`--long-tokens`, 8 tokens out) at 0.5 s and every 3 s after. Arrival
times are the scheduled ones, so a request that arrives during a long step counts the wait. Configurations:
  single          one process, all cores, max_num_batched_tokens 2048 (a long prompt is one long step)
  single-chunked  the same, max_num_batched_tokens 256 (chunked prefill: the usual single-process cure)
  disaggregated   prefill=1,decode=1: one core for the prefill worker, one for this (decode) process
On a 2-core box the decode side has half the cores, so its steady inter-token latency is worse; the point
is the tail (p99 / max gap of the short streams) and the short requests' TTFT while long prompts prefill.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, percentile, table  # noqa: E402

SHORT = "Write one sentence about the sea, the wind and a small boat at dawn, please."
LONG = ("The history of computing is a story of abstractions stacked on abstractions: switches became gates, "
        "gates became adders, adders became processors, and processors became the substrate for languages, "
        "operating systems and networks. ")


def run(model: str, name: str, opts: dict[str, Any], long_tokens: int, seconds: float, gap_s: float) -> dict[str, Any]:
    from hitenter.llm import LLM
    from hitenter.sampling_params import SamplingParams

    llm = LLM(model, max_model_len=2048, kv_cache_memory=128 << 20, **opts)
    eng = llm.engine
    long_ids = (eng.tokenizer.encode(LONG) * (long_tokens // 30 + 1))[:long_tokens]
    try:
        llm.generate(SHORT, SamplingParams(max_tokens=4))            # warm-up
        llm.generate(long_ids[:300], SamplingParams(max_tokens=2))
        t0 = time.monotonic()
        arrivals: list[tuple[float, str, Any, SamplingParams]] = []
        t = 0.0
        while t < seconds:
            arrivals.append((t0 + t, "short", SHORT, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)))
            t += gap_s
        t = 0.5
        while t < seconds:
            arrivals.append((t0 + t, "long", long_ids, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)))
            t += 3.0
        arrivals.sort(key=lambda a: a[0])
        kinds: dict[str, str] = {}
        final: dict[str, Any] = {}
        while arrivals or eng.has_unfinished_requests():
            now = time.monotonic()
            while arrivals and arrivals[0][0] <= now:
                at, kind, prompt, sp = arrivals.pop(0)
                kinds[eng.add_request(None, prompt, sp, arrival_time=at)] = kind
            if not eng.has_unfinished_requests():
                time.sleep(max(0.0, min(arrivals[0][0] - now, 0.01)) if arrivals else 0)
                continue
            for out in eng.step():
                if out.finished:
                    final[out.request_id] = out
    finally:
        llm.close()
    res: dict[str, Any] = {"config": name}
    for kind in ("short", "long"):
        outs = [o for rid, o in final.items() if kinds[rid] == kind]
        ttft = [o.metrics.time_to_first_token * 1e3 for o in outs]
        res[f"{kind}_n"] = len(outs)
        res[f"{kind}_ttft_p50_ms"] = statistics.median(ttft) if ttft else float("nan")
        res[f"{kind}_ttft_p99_ms"] = percentile(ttft, 99)
        if kind == "short":
            gaps = [(b - a) * 1e3 for o in outs for a, b in pairwise(o.metrics.token_times)]
            res["itl_p50_ms"], res["itl_p99_ms"], res["itl_max_ms"] = (
                statistics.median(gaps), percentile(gaps, 99), max(gaps))
        else:
            d = [o.extra.get("disaggregated") for o in outs if o.extra.get("disaggregated")]
            if d:
                res["long_prefill_ms"] = statistics.median(x["prefill_s"] for x in d) * 1e3
                res["long_transfer_ms"] = statistics.median(x["transfer_s"] for x in d) * 1e3
                res["long_kv_mib"] = d[0]["kv_bytes"] / 2**20
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--long-tokens", type=int, default=1500)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--gap-ms", type=float, default=150.0)
    ap.add_argument("--only", default=None, help="run one configuration")
    a = ap.parse_args()
    cores = os.cpu_count() or 2
    configs = {"single": dict(num_threads=cores),
               "single-chunked": dict(num_threads=cores, max_num_batched_tokens=256),
               "disaggregated": dict(num_threads=max(1, cores // 2), disaggregate="prefill=1,decode=1")}
    rows = []
    for n, o in configs.items():
        if a.only in (None, n):
            rows.append(run(a.model, n, o, a.long_tokens, a.seconds, a.gap_ms / 1e3))
            print(rows[-1], flush=True)
    cols = ["config", "short_n", "short_ttft_p50_ms", "short_ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "itl_max_ms",
            "long_n", "long_ttft_p50_ms"]
    print(table([[r.get(c, "") for c in cols] for r in rows], cols))
    for r in rows:
        if "long_prefill_ms" in r:
            print(f"{r['config']}: long prompt prefill {r['long_prefill_ms']:.0f} ms on the worker, "
                  f"KV transfer {r['long_transfer_ms']:.1f} ms for {r['long_kv_mib']:.1f} MiB")
    emit_json("disaggregated", {"model": a.model, "long_tokens": a.long_tokens, "gap_ms": a.gap_ms, "runs": rows})


if __name__ == "__main__":
    main()
