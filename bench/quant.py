"""Weight formats side by side: fp32 (`none`) vs int8 vs int4 weights kept in memory, in one run.

    .venv/bin/python bench/quant.py [--model smollm2-135m-instruct] [--threads 2] [--kernels] [--profile]

Per format: resident weight bytes, decode tokens/s at batch 1, prefill tokens/s at 512 prompt tokens,
and output tokens/s for 16 concurrent requests (engine, batch_invariant on, median of --repeats),
with the ratios to fp32. --kernels adds a micro-benchmark of the raw kernels (fp32 F.linear vs int8 /
int4 with fp32 and bf16 activations) on the model's shapes; --profile prints torch.profiler's top
entries for one decode step of each format.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402

FORMATS = ("none", "int8", "int4")


def engine_rates(model: str, quant: str, decode: int, prefill: int, batch: int, repeats: int) -> dict[str, float]:
    from hitenter import LLM, SamplingParams

    llm = LLM(model, enable_prefix_caching=False, quantization=quant, max_num_batched_tokens=max(prefill, 2048))
    greedy = SamplingParams(temperature=0, max_tokens=decode, ignore_eos=True)

    def decode_b1() -> float:
        times: list[float] = []
        llm.generate([list(range(100, 116))], greedy, on_output=lambda o: times.append(time.perf_counter()))
        return (len(times) - 1) / (times[-1] - times[0])

    def prefill_rate() -> float:
        toks = [100 + (i * 7919) % 40000 for i in range(prefill)]
        t0 = time.perf_counter()
        llm.generate([toks], SamplingParams(temperature=0, max_tokens=1))
        return prefill / (time.perf_counter() - t0)

    def batched() -> float:
        prompts = [list(range(100 + i, 164 + i)) for i in range(batch)]
        t0 = time.perf_counter()
        llm.generate(prompts, greedy)
        return batch * decode / (time.perf_counter() - t0)

    out: dict[str, float] = {"weight_bytes": float(llm.engine.parts.model.weight_bytes())}
    for name, fn in (("decode_b1", decode_b1), ("prefill_512", prefill_rate), (f"batch_{batch}", batched)):
        vals = [fn() for _ in range(repeats + 1)][1:]   # the first run warms up
        out[name] = statistics.median(vals)
    return out


def _time_us(fn: Callable[[], object], seconds: float = 0.2) -> float:
    for _ in range(2):
        fn()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def kernels() -> list[list[object]]:
    import torch
    from torch.nn import functional as F

    from hitenter.quant import Int4Linear, Int8Linear, int4_from_float, int8_from_float

    rows: list[list[object]] = []
    for n, k in ((960, 576), (3072, 576), (576, 1536), (49152, 576)):
        w = torch.randn(n, k) * 0.05
        q8, q4 = int8_from_float(w), int4_from_float(w)
        mods = {f"{kind} {dt}": (Int8Linear(q8, compute_dtype=dt) if kind == "int8" else Int4Linear(q4, compute_dtype=dt))
                for kind in ("int8", "int4") for dt in (torch.bfloat16, torch.float32)}
        for m in (1, 8, 512):
            if m == 512 and n == 49152:
                continue
            x = torch.randn(m, k)
            fp = _time_us(lambda x=x, w=w: F.linear(x, w))
            rows.append([f"{n}x{k}", m, fp] + [_time_us(lambda mod=mod, x=x: mod(x)) if not (m == 512 and "float32" in name)
                                               else float("nan") for name, mod in mods.items()])
    return rows


def profile(model: str, quant: str) -> str:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    from hitenter import LLM, SamplingParams

    llm = LLM(model, enable_prefix_caching=False, quantization=quant)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm.generate([list(range(100, 116))], params)
    with tprof(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate([list(range(100, 116))], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    del torch
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    if a.kernels:
        print(table(kernels(), ["shape NxK", "M", "fp32 us", "int8 bf16", "int8 fp32", "int4 bf16", "int4 fp32"]))
    res = {q: engine_rates(a.model, q, a.decode, a.prefill, a.batch, a.repeats) for q in a.formats}
    keys = ["weight_bytes", "decode_b1", f"prefill_{a.prefill}", f"batch_{a.batch}"]
    base = res.get("none")
    rows = [[q] + [res[q][k] / 1e6 if k == "weight_bytes" else res[q][k] for k in keys]
            + ([res[q][k] / base[k] for k in keys] if base else []) for q in a.formats]
    head = ["format", "weights MB", "decode b1 tok/s", f"prefill {a.prefill} tok/s", f"{a.batch} req tok/s"]
    print(table(rows, head + (["ratio " + k for k in keys] if base else [])))
    if a.profile:
        for q in a.formats:
            print(f"--- decode profile, {q} (8 decode steps, top entries by self CPU time)\n{profile(a.model, q)}")
    emit_json("quant", {"results": res, "threads": a.threads})


if __name__ == "__main__":
    main()
