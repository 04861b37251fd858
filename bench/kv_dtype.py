"""Decode tokens/s at a long context with each KV cache type, side by side in one process, alternating.

    .venv/bin/python bench/kv_dtype.py [--model NAME] [--context 2000] [--decode 64] [--rounds 3]
                                       [--dtypes float32,float16] [--threads N]

One engine per `kv_cache_dtype` (the same weights file, prefix caching off so every round prefills), each
round runs every engine once in turn: a `--context`-token prompt, then `--decode` greedy tokens; decode
tok/s = tokens after the first / time between the first and the last. Prints the best round per type and
the bytes per token of each cache (hitenter/models/kv_dtype.py), the CPU and whether it has F16C."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()

    import torch

    from hitenter import LLM, SamplingParams
    from hitenter.models.kv_dtype import cpu_has_f16c

    if a.threads:
        torch.set_num_threads(a.threads)
    dtypes = a.dtypes.split(",")
    n_ctx = a.context + a.decode + 16
    engines = {d: LLM(a.model, kv_cache_dtype=d, enable_prefix_caching=False, max_model_len=n_ctx,
                      max_num_batched_tokens=a.context, num_threads=a.threads) for d in dtypes}
    prompt = [100 + (i * 7919) % 40000 for i in range(a.context)]
    sp = SamplingParams(temperature=0, max_tokens=a.decode + 1, ignore_eos=True)
    best = dict.fromkeys(dtypes, 0.0)
    for r in range(a.rounds):
        for d, llm in engines.items():
            times: list[float] = []
            llm.generate([prompt], sp, on_output=lambda o, t=times: t.append(time.perf_counter()))
            rate = (len(times) - 1) / (times[-1] - times[0])
            print(f"round {r} {d:9s} decode {rate:6.2f} tok/s", flush=True)
            best[d] = max(best[d], rate)
    rows = []
    for d, llm in engines.items():
        plan = llm.engine.parts.plan
        rows.append([d, plan.kv_bytes_per_token, best[d], best[d] / best[dtypes[0]]])
    print(f"CPU {cpu_name()}, F16C {cpu_has_f16c()}, torch threads {torch.get_num_threads()}, "
          f"context {a.context}, decode {a.decode}")
    print(table(rows, ["kv_cache_dtype", "KV bytes/token", "decode tok/s (best)", f"vs {dtypes[0]}"]))


if __name__ == "__main__":
    main()
