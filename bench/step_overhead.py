"""A decode step's overhead: step time minus the time inside the native kernels (issue 16's figure).

    .venv/bin/python bench/step_overhead.py [--model smollm2-135m-instruct] [--tokens 128] [--threads 1]

Runs greedy batch-1 decoding through LLM.generate and splits every engine step into the native calls
(the fused decoder layers, `fused_decode.run_all_layers`, and the quantized matmuls such as the LM head,
`qmatmul`) and everything else (embedding lookup, RoPE table, final norm, sampling, scheduling, output
processing, Python). Times are the calling thread's CPU clock with --threads 1 (the kernels then run on
that thread), so other processes on a shared machine do not inflate them; with more threads it falls
back to wall time. Prints ms per step for each part and a JSON line. Say which CPU you ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hitenter.engine import llm_engine
from hitenter.llm import LLM
from hitenter.models import block_linear, fused_decode
from hitenter.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    native = [0.0]

    def timed(fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            t = clock()
            try:
                return fn(*a, **k)
            finally:
                native[0] += clock() - t
        return wrapper

    fused_decode.run_all_layers = timed(fused_decode.run_all_layers)
    block_linear.qmatmul = timed(block_linear.qmatmul)
    llm = LLM(args.model)
    steps: list[tuple[float, float]] = []
    step = llm_engine.LLMEngine.step

    def timed_step(self):  # type: ignore[no-untyped-def]
        native[0] = 0.0
        t = clock()
        out = step(self)
        steps.append((clock() - t, native[0]))
        return out

    llm_engine.LLMEngine.step = timed_step   # type: ignore[method-assign]
    sp = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    rows = []
    for _ in range(args.rounds):
        steps.clear()
        llm.generate(["Write a story about a lighthouse keeper."], sp)
        decode = [s for s in steps[2:] if s[0] > 0]   # skip the prompt step
        rows.append((statistics.median(s[0] for s in decode) * 1e3, statistics.median(s[1] for s in decode) * 1e3))
    total = statistics.median(r[0] for r in rows)
    nat = statistics.median(r[1] for r in rows)
    print(f"{args.model}, {args.threads} thread(s), {'thread CPU' if args.threads == 1 else 'wall'} clock")
    print(f"  step {total:.2f} ms = native kernels {nat:.2f} ms + overhead {total - nat:.2f} ms")
    print(json.dumps({"model": args.model, "threads": args.threads, "step_ms": round(total, 3),
                      "native_ms": round(nat, 3), "overhead_ms": round(total - nat, 3)}))


if __name__ == "__main__":
    main()
