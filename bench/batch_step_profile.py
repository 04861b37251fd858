"""Where a batched decode step goes: CPU time per part of an engine step at N concurrent requests.

    .venv/bin/python bench/batch_step_profile.py [--model smollm2-135m-instruct] [-n 16,32] [--threads 1]

For each N, N greedy requests (``--input-len`` random words, ``--output-len`` tokens, ignore_eos) run through
LLMEngine.step; only the steps where all N rows decode (one new token each) are counted. Each step is split
by wrapping the engine's parts on this instance (nothing global changes): scheduling, the model forward
(the fused native layers, the LM head, the rest: embedding, metadata, final norm), sampling, the
scheduler's update, output processing (detokenization), and the rest of the step. Then the kernels of the
fused layer are timed alone on the model's own weights at M = N (each projection's qmatmul, the decode
attention over a cache holding the same contexts), so the C layer's glue is its total minus those.

Clock: the calling thread's CPU time with --threads 1 (the kernels run on that thread), so other processes
on a shared machine inflate the figures little; with more threads, process CPU time (both threads, their
OpenMP spin-waits included) and wall time are both printed. Say the CPU with the figures (printed first).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line  # noqa: E402

WORDS = ("the cat dog house tree river mountain city music light water fire stone road cloud garden "
         "story window table morning evening summer winter quiet bright small large old new green").split()


class Clock:
    """Named CPU-time accumulators for the current step."""

    def __init__(self, fn: Callable[[], float]) -> None:
        self.fn = fn
        self.parts: dict[str, float] = defaultdict(float)

    def wrap(self, obj: Any, name: str, label: str) -> None:
        orig = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t = self.fn()
            try:
                return orig(*a, **k)
            finally:
                self.parts[label] += self.fn() - t
        setattr(obj, name, timed)


def prompts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def engine_steps(llm: Any, n: int, args: argparse.Namespace, clock: Clock, wall: dict[str, float]) -> list[dict[str, float]]:
    """Per-part CPU seconds of every step where all n requests decode one token."""
    from hitenter.sampling_params import SamplingParams

    eng = llm.engine
    # long enough that all n decode together for a while (prompts are paced beside decoding streams), then
    # stopped after --steps such steps
    sp = SamplingParams(temperature=0.0, max_tokens=args.output_len + args.steps, ignore_eos=True)
    ids = [eng.add_request(None, p, sp) for p in prompts(n, args.input_len, args.seed + n)]
    rows: list[dict[str, float]] = []
    try:
        while eng.has_unfinished_requests() and len(rows) < args.steps + 2:
            clock.parts.clear()
            t, w = clock.fn(), time.perf_counter()
            eng.step()
            total, wtotal = clock.fn() - t, time.perf_counter() - w
            sched = eng._profile_last_sched
            if len(sched.scheduled) == n and all(s.num_new_tokens == 1 for s in sched.scheduled) \
                    and all(s.num_computed_tokens >= s.request.num_prompt_tokens for s in sched.scheduled):
                rows.append({"step": total, "wall": wtotal, **clock.parts})
    finally:
        for rid in ids:
            eng.abort(rid)
    return rows[2:]   # skip the first decode steps (first-call costs)


def kernel_times(llm: Any, n: int, args: argparse.Namespace, clock: Clock) -> dict[str, float]:
    """CPU seconds per step of the fused layer's kernels at M = n on the model's weights (all layers)."""
    import torch

    from hitenter.kernels import qmatmul
    from hitenter.models import decode_kernel

    model = llm.engine.parts.model
    layer = model.layers[0]
    x = torch.randn(n, model.config.hidden_size)
    out: dict[str, float] = {}

    def time_it(fn: Callable[[], Any], reps: int) -> float:
        fn()
        best = []
        for _ in range(3):
            t = clock.fn()
            for _ in range(reps):
                fn()
            best.append((clock.fn() - t) / reps)
        return min(best)

    L = len(model.layers)
    for name in ("qkv", "o_proj", "gate_up", "down"):
        mod = getattr(layer, name)
        xi = torch.randn(n, mod.in_features)
        per = 0.0
        for p in mod.parts:
            per += time_it(lambda p=p, xi=xi: qmatmul(xi, p), 20)
        out[f"gemm {name} {mod.out_features}x{mod.in_features} {'+'.join(p.type_name for p in mod.parts)}"] = per * L
    head = model.head
    hp = getattr(head, "parts", None)
    if hp:
        out[f"lm head {head.out_features}x{head.in_features} {hp[0].type_name}"] = \
            time_it(lambda: qmatmul(x, hp[0]), 3)
    cache = llm.engine.runner.kv_caches[0]
    _, kvh, nb, bs, d = cache.shape
    ctx = args.input_len + args.output_len // 2   # a mid-generation context (prompt words ~ tokens)
    per_seq = -(-ctx // bs)
    if n * per_seq <= nb:
        tables = torch.arange(n * per_seq, dtype=torch.long)
        starts = torch.arange(0, n * per_seq, per_seq, dtype=torch.long)
        ctxs = torch.full((n,), ctx, dtype=torch.long)
        q = torch.randn(n, layer.num_heads, d)
        out[f"attention ctx {ctx}"] = time_it(
            lambda: decode_kernel.decode_attention(q, cache, ctxs, starts, tables, layer.scale), 20) * L
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("-n", "--concurrency", default="16,32")
    ap.add_argument("--input-len", type=int, default=128, help="prompt length in words")
    ap.add_argument("--output-len", type=int, default=128, help="tokens per request (plus --steps)")
    ap.add_argument("--steps", type=int, default=40, help="decode steps with all N rows to measure")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    from hitenter.llm import LLM
    from hitenter.models import fused_decode

    torch.set_num_threads(args.threads)
    clock = Clock(time.thread_time if args.threads == 1 else time.process_time)
    print(cpu_line())
    levels = [int(v) for v in args.concurrency.split(",") if v.strip()]
    llm = LLM(args.model, num_threads=args.threads, enable_prefix_caching=False, max_num_seqs=max(levels))
    eng = llm.engine
    sched_fn = eng.scheduler.schedule

    def schedule() -> Any:
        s = sched_fn()
        eng._profile_last_sched = s
        return s
    eng.scheduler.schedule = schedule
    clock.wrap(eng.scheduler, "schedule", "schedule")
    clock.wrap(eng.runner, "execute", "model")
    clock.wrap(fused_decode, "run_all_layers", "model: fused layers")
    if hasattr(eng.runner, "logits"):   # the runner's logits function (the model's compute_logits by default)
        clock.wrap(eng.runner, "logits", "model: lm head")
    else:
        clock.wrap(eng.runner.model, "compute_logits", "model: lm head")
    clock.wrap(eng, "_sample", "sample")
    clock.wrap(eng.scheduler, "update", "scheduler update")
    clock.wrap(eng.output_processor, "process", "output processing")
    clock.wrap(eng, "_after_step", "after step")
    result: dict[str, Any] = {"cpu": cpu_line(), "threads": args.threads}
    for n in levels:
        rows = engine_steps(llm, n, args, clock, {})
        keys = {k for r in rows for k in r} | {"model: fused layers", "model: lm head"}
        med = {k: statistics.median(r.get(k, 0.0) for r in rows) * 1e3 for k in keys}
        med["model: rest"] = med["model"] - med["model: fused layers"] - med["model: lm head"]
        parts = ["schedule", "model", "model: fused layers", "model: lm head", "model: rest", "sample",
                 "scheduler update", "output processing", "after step"]
        med["other"] = med["step"] - sum(med[p] for p in parts if not p.startswith("model:"))
        kern = {k: v * 1e3 for k, v in kernel_times(llm, n, args, clock).items()}
        lay = med["model: fused layers"]
        glue = lay - sum(v for k, v in kern.items() if not k.startswith("lm head"))
        clk = "thread CPU" if args.threads == 1 else "process CPU"
        print(f"\nN = {n}: {len(rows)} decode steps, median {clk} ms per step (wall {med['wall']:.2f} ms), "
              f"{args.threads} thread(s)")
        for p in ["step"] + parts + ["other"]:
            print(f"  {p:28s} {med[p]:8.2f} ms  {100 * med[p] / med['step']:5.1f}%")
        print("  kernels alone at M = N (all layers):")
        for k, v in kern.items():
            print(f"    {k:44s} {v:8.2f} ms")
        print(f"    {'fused layer glue (layers - kernels)':44s} {glue:8.2f} ms")
        result[str(n)] = {"step_ms": med, "kernels_ms": kern, "glue_ms": glue,
                          "tok_s_cpu": n / med["step"] * 1e3}
    print("JSON " + json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    llm.close()


if __name__ == "__main__":
    main()
