"""Tensor parallelism: TP=2 vs TP=1 decode tokens/s, TTFT and the communication cost per step.

    .venv/bin/python bench/tensor_parallel.py [--model smollm2-135m-instruct] [--max-tokens 64] [--repeats 2]

Runs: TP=1 with all cores, TP=1 with one thread per rank's share, and TP=2 (one process per share,
gloo on 127.0.0.1). On a 2-core box TP cannot be faster: the point is the per-step price of the
collectives (batch broadcast from rank 0, two all-reduces per layer + one for the vocab-parallel
embedding, the logits gather), measured on rank 0 (it includes waiting for the slower rank), plus a
micro-benchmark of the bare gloo latencies between two idle processes. Decode rate = (tokens - 1) / (last - first output).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402

PROMPT = ("Explain, step by step, how a hash table handles collisions, and compare open addressing "
          "with separate chaining in terms of memory use, cache behaviour and worst-case lookups.")


def _timed_generate(llm: Any, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, decode tokens/s, tokens) of one batch-1 greedy request."""
    from hitenter import SamplingParams

    t0 = time.perf_counter()
    stamps: list[float] = []
    llm.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                 on_output=lambda o: stamps.append(time.perf_counter()) if o.outputs[0].delta_token_ids else None)
    n = len(stamps)
    rate = (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else float("nan")
    return stamps[0] - t0, rate, n


def run(model: str, tp: int, threads: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    from hitenter.llm import LLM

    llm = LLM(model, tensor_parallel_size=tp, num_threads=threads, max_model_len=512, kv_cache_memory=64 << 20)
    runner = llm.engine.runner
    steps = [0]
    orig = runner.execute

    def counting(out: Any) -> Any:
        steps[0] += 1
        return orig(out)

    runner.execute = counting
    try:
        _timed_generate(llm, PROMPT, 4)                         # warm-up
        best: tuple[float, float, int] | None = None
        comm0 = getattr(runner, "comm_seconds", 0.0)
        bcast0 = runner.model.broadcast_seconds if tp > 1 else 0.0
        calls0 = runner.model.group.comm_calls if tp > 1 else 0
        steps[0] = 0
        for _ in range(repeats):
            llm.engine.kv_manager.reset_prefix_cache()
            r = _timed_generate(llm, PROMPT, max_tokens)
            best = r if best is None or r[1] > best[1] else best
        assert best is not None
        res: dict[str, Any] = {"tp": tp, "threads_per_rank": threads, "ttft_ms": best[0] * 1e3,
                               "decode_tok_s": best[1], "steps": steps[0]}
        if tp > 1:
            n = max(steps[0], 1)
            res["comm_ms_per_step"] = (runner.comm_seconds - comm0) / n * 1e3
            res["broadcast_ms_per_step"] = (runner.model.broadcast_seconds - bcast0) / n * 1e3
            res["collectives_per_step"] = (runner.model.group.comm_calls - calls0) / n
        return res
    finally:
        llm.close()


def _micro_rank(rank: int, port: int, hidden: int, iters: int, out: Any) -> None:
    import pickle

    import torch
    from torch import distributed as dist

    from hitenter.distributed.group import broadcast_object
    from hitenter.models.attention import AttentionMetadata

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.randn(8, hidden)            # one decode step's padded rows
    meta = AttentionMetadata([0, 1], [200], [list(range(13))], torch.tensor([199]), 16)
    msg = ("forward", torch.tensor([5]), torch.tensor([199]), meta)
    res = {}
    for name, fn in (("all_reduce_8xH", lambda: dist.all_reduce(x)),
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
    """Pure gloo latency between two processes (no compute skew): µs per all-reduce / batch broadcast."""
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
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    rows = [run(a.model, 1, cores, a.max_tokens, a.repeats),
            run(a.model, 1, max(1, cores // 2), a.max_tokens, a.repeats),
            run(a.model, 2, max(1, cores // 2), a.max_tokens, a.repeats)]
    print(table([[r["tp"], r["threads_per_rank"], r["ttft_ms"], r["decode_tok_s"],
                  r.get("comm_ms_per_step", 0.0), r.get("broadcast_ms_per_step", 0.0),
                  r.get("collectives_per_step", 0.0)] for r in rows],
                ["TP", "threads/rank", "TTFT ms", "decode tok/s", "comm ms/step", "of which bcast", "collectives/step"]))
    from hitenter.llm import LLM

    hidden = LLM(a.model, max_model_len=64, kv_cache_memory=8 << 20).model_config.hidden_size
    micro = comm_micro(hidden)
    print(f"gloo, 2 processes, H={hidden}: all-reduce [8, H] {micro['all_reduce_8xH']:.0f} us, "
          f"decode-batch broadcast ({micro['batch_pickle_bytes']} B pickled) {micro['broadcast_batch']:.0f} us")
    emit_json("tensor_parallel", {"model": a.model, "max_tokens": a.max_tokens, "runs": rows, "gloo_micro_us": micro})


if __name__ == "__main__":
    main()
