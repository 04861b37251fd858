"""Tensor parallelism: TP=2 vs TP=1 in the default format (the file's GGUF blocks), same run.

    .venv/bin/python bench/tensor_parallel.py [--model smollm2-135m-instruct] [--max-tokens 64] [--rounds 3]

Configurations: TP=1 with all cores, TP=1 with one rank's share of the threads, TP=2 (one process per
share, gloo on 127.0.0.1). Each round runs every configuration once, in turn, each in a fresh child
process (so each process's RSS is its own): load, a warm-up request, one timed batch-1 greedy request,
then the resident set of every process of the configuration (rank 0 and the worker) and rank 0's
weight bytes. Reported: medians over the rounds of decode tok/s ((tokens - 1) / (last - first output))
and TTFT, the RSS per process, the communication per step measured on rank 0 (batch broadcast,
all-gathers of the row-parallel layers, embedding all-reduce, logits gather; it includes waiting for the
slower rank), whether each round's tokens equal that round's TP=1 (all cores), and a micro-benchmark of the bare gloo latencies.
On a 2-core box TP cannot be faster than TP=1 on both cores: the point is memory per process and the
per-step price of the collectives. Figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line, emit_json, table  # noqa: E402

PROMPT = ("Explain, step by step, how a hash table handles collisions, and compare open addressing "
          "with separate chaining in terms of memory use, cache behaviour and worst-case lookups.")


def _rss(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def child(model: str, tp: int, threads: int, max_tokens: int) -> dict[str, Any]:
    """One configuration in this process: load, warm up, one timed request, the processes' RSS."""
    from hitenter import SamplingParams
    from hitenter.llm import LLM

    llm = LLM(model, tensor_parallel_size=tp, num_threads=threads, max_model_len=512, kv_cache_memory=64 << 20)
    runner = llm.engine.runner
    steps = [0]
    orig = runner.execute

    def counting(out: Any) -> Any:
        steps[0] += 1
        return orig(out)

    runner.execute = counting
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    try:
        llm.generate(PROMPT, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))   # warm-up
        llm.engine.kv_manager.reset_prefix_cache()
        comm0 = getattr(runner, "comm_seconds", 0.0)
        steps[0] = 0
        stamps: list[float] = []
        t0 = time.perf_counter()
        out = llm.generate(PROMPT, sp, on_output=lambda o: stamps.append(time.perf_counter())
                           if o.outputs[0].delta_token_ids else None)[0]
        n = len(stamps)
        inner = runner.model.inner if tp > 1 else runner.model
        res: dict[str, Any] = {"tp": tp, "threads_per_rank": threads, "ttft_ms": (stamps[0] - t0) * 1e3,
                               "decode_tok_s": (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else float("nan"),
                               "tokens": list(out.outputs[0].token_ids), "weight_mb_rank0": inner.weight_bytes() / 1e6,
                               "rss_mb": [_rss(os.getpid()) / 1e6] + [_rss(p.pid) / 1e6 for p in
                                                                       (runner.workers.procs if tp > 1 else [])]}
        if tp > 1:
            res["comm_ms_per_step"] = (runner.comm_seconds - comm0) / max(steps[0], 1) * 1e3
        return res
    finally:
        llm.close()


def _spawn(model: str, tp: int, threads: int, max_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps([model, tp, threads, max_tokens])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def _micro_rank(rank: int, port: int, hidden: int, iters: int, out: Any) -> None:
    import pickle

    import torch
    from torch import distributed as dist

    from hitenter.distributed.group import broadcast_object
    from hitenter.models.attention import AttentionMetadata

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.randn(1, hidden)            # one decode row
    parts = [torch.empty_like(x) for _ in range(2)]
    meta = AttentionMetadata([0, 1], [200], [list(range(13))], torch.tensor([199]), 16)
    msg = ("forward", torch.tensor([5]), torch.tensor([199]), meta)
    res = {}
    for name, fn in (("all_reduce_1xH", lambda: dist.all_reduce(x)),
                     ("all_gather_1xH", lambda: dist.all_gather(parts, x)),
                     ("broadcast_batch", lambda: broadcast_object(msg if rank == 0 else None))):
        for _ in range(20):
            fn()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        res[name] = (time.perf_counter() - t0) / iters * 1e6
    res["batch_pickle_bytes"] = len(pickle.dumps(msg))
    if rank == 0:
        out.put(res)
    dist.destroy_process_group()


def comm_micro(hidden: int, iters: int = 500) -> dict[str, float]:
    """Pure gloo latency between two processes (no compute skew): µs per collective."""
    import torch.multiprocessing as mp

    from hitenter.distributed.runner import _free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_micro_rank, args=(r, port, hidden, iters, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = q.get(timeout=120)
    for p in procs:
        p.join(30)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*json.loads(a.child))))
        return
    cores = os.cpu_count() or 1
    configs = [(1, cores), (1, max(1, cores // 2)), (2, max(1, cores // 2))]
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(a.rounds):                      # alternating rounds: every configuration once per round
        for tp, threads in configs:
            runs[(tp, threads)].append(_spawn(a.model, tp, threads, a.max_tokens))
    rows, summary = [], []
    for (tp, threads), rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("decode_tok_s", "ttft_ms", "weight_mb_rank0")}
        rss = [statistics.median(r["rss_mb"][i] for r in rs) for i in range(len(rs[0]["rss_mb"]))]
        comm = statistics.median(r.get("comm_ms_per_step", 0.0) for r in rs)
        same = all(r["tokens"] == ref["tokens"] for r, ref in zip(rs, runs[configs[0]], strict=True))   # per round
        rows.append([tp, threads, med["decode_tok_s"], med["ttft_ms"], med["weight_mb_rank0"],
                     " + ".join(f"{x:.0f}" for x in rss), comm, same])
        summary.append({"tp": tp, "threads_per_rank": threads, **med, "rss_mb_per_process": rss,
                        "comm_ms_per_step": comm, "tokens_equal_tp1": same,
                        "decode_tok_s_rounds": [r["decode_tok_s"] for r in rs]})
    print(cpu_line())
    print(f"{a.model}, default format (GGUF blocks), batch 1 greedy, {a.max_tokens} tokens, medians of {a.rounds} "
          f"alternating rounds (each a fresh process; shared machine: noisy)")
    print(table(rows, ["TP", "threads/rank", "decode tok/s", "TTFT ms", "weights MB rank 0", "RSS MB per process",
                       "comm ms/step", "tokens = TP=1"]))
    from hitenter.llm import LLM

    hidden = LLM(a.model, max_model_len=64, kv_cache_memory=8 << 20).model_config.hidden_size
    micro = comm_micro(hidden)
    print(f"gloo, 2 idle processes, H={hidden}: all-reduce [1, H] {micro['all_reduce_1xH']:.0f} us, all-gather "
          f"[1, H] {micro['all_gather_1xH']:.0f} us, decode-batch broadcast ({micro['batch_pickle_bytes']} B) "
          f"{micro['broadcast_batch']:.0f} us")
    emit_json("tensor_parallel", {"model": a.model, "max_tokens": a.max_tokens, "cpu": cpu_line(), "runs": summary,
                                  "gloo_micro_us": micro})


if __name__ == "__main__":
    main()
