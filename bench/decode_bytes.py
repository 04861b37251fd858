"""Where the bytes of a batch-1 decode step go, and at what speed each part reads them.

    .venv/bin/python bench/decode_bytes.py --model /work/models/qwen35-2b-syn.gguf [--steps 32] [--rounds 3]

Loads the model as bench/vs_llamacpp.py's worker does (one sequence, no prefix cache), times every part
of the decode steps with nested wall-clock ranges (the matmuls are native calls that return when done,
so a range around one is its time) and prints per part: calls per step, bytes per step, ms per step
(its own time, nested ranges taken out), GB/s, and the calling thread's own CPU ms (for the single-threaded
glue this is its cost even on a loaded machine; a native call's other threads are not in it). Bytes counted:

- a linear (BlockLinear / Linear): its weight bytes (activations are a few KB);
- a recurrent layer's fused step (Gated DeltaNet, Mamba2): its slot's state read and written
  (2 x the state's bytes: the conv tail and the ssm state, fp32);
- the embedding: one row; attention and norms: not counted (KV of a short context, a few KB).

"rest" is the step's time outside the timed parts (the engine's Python, sampling, the torch glue
between the kernels). Compare the GB/s with bench/memory_bandwidth.py's ceiling on the same machine;
the load average is printed beside. Each round is one generate() of --steps tokens; the medians over
rounds (after one warm-up) are printed.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json  # noqa: E402

LINEARS = ("BlockLinear", "Linear", "Int4Linear", "Int8Linear")


class Ranges:
    """Nested wall-clock ranges: per label, calls and own seconds (time in ranges nested inside taken out)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.own: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)   # the calling thread's own CPU seconds
        self.bytes: dict[str, int] = defaultdict(int)
        self.stack: list[tuple[float, float]] = []   # per open range: wall and CPU seconds in its children

    def wrap(self, label: str, nbytes: int, f: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            self.stack.append((0.0, 0.0))
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return f(*args, **kw)
            finally:
                dt, dc = time.perf_counter() - t0, time.thread_time() - c0
                inner, inner_cpu = self.stack.pop()
                self.own[label] += dt - inner
                self.cpu[label] += dc - inner_cpu
                self.calls[label] += 1
                self.bytes[label] += nbytes
                if self.stack:
                    w, c = self.stack[-1]
                    self.stack[-1] = (w + dt, c + dc)
        return timed

    def reset(self) -> None:
        self.calls.clear()
        self.own.clear()
        self.cpu.clear()
        self.bytes.clear()


def label_of(name: str) -> str:
    last = name.split(".")[-1]
    return "head" if name == "head" else last


def instrument(model: Any, r: Ranges) -> None:  # type: ignore[no-untyped-def]
    from hitenter.quant import weight_bytes

    for name, m in model.named_modules():
        kind = type(m).__name__
        if kind in LINEARS:
            m.forward = r.wrap("linear:" + label_of(name), weight_bytes(m), m.forward)
        elif kind == "GatedDeltaNet":
            state = 4 * sum(math.prod(s) for s in m.state_shapes().values())
            m._fused = r.wrap("gdn state step", 2 * state, m._fused)
        elif kind == "AttentionMixer":
            m.forward = r.wrap("attention (not its linears)", 0, m.forward)
        elif name == "embed":   # one row per decode step
            m.forward = r.wrap("embedding", weight_bytes(m) // max(1, getattr(m, "num_embeddings", 1)), m.forward)
    model.forward = r.wrap("model glue (norms, adds, torch ops)", 0, model.forward)
    model.compute_logits = r.wrap("logits glue", 0, model.compute_logits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import torch

    from hitenter import LLM, SamplingParams

    torch.set_num_threads(a.threads)
    llm = LLM(a.model, enable_prefix_caching=False, max_num_seqs=1, max_model_len=4096)
    model = llm.engine.parts.model
    r = Ranges()
    instrument(model, r)
    sp = SamplingParams(temperature=0, max_tokens=a.steps + 1, ignore_eos=True)
    prompt = [list(range(100, 116))]
    llm.generate(prompt, sp)   # warm-up
    per_round: list[dict[str, tuple[float, float, float]]] = []
    step_ms: list[float] = []
    loads = []
    for _ in range(a.rounds):
        times: list[float] = []

        def on_output(o: Any, t: list[float] = times) -> None:
            t.append(time.perf_counter())
            if len(t) == 1:   # the prompt's step is done: count the decode steps' parts only
                r.reset()

        loads.append(os.getloadavg()[0])
        llm.generate(prompt, sp, on_output=on_output)
        total_steps = len(times) - 1
        step_ms.append((times[-1] - times[0]) / total_steps * 1e3)
        per_round.append({k: (r.calls[k] / total_steps, r.bytes[k] / total_steps, r.own[k] / total_steps * 1e3,
                              r.cpu[k] / total_steps * 1e3) for k in r.own})
    keys = sorted(per_round[0], key=lambda k: -statistics.median(p[k][2] for p in per_round))
    ms = statistics.median(step_ms)
    print(f"{a.model}: {ms:.2f} ms per decode step ({1e3 / ms:.2f} tok/s), {a.threads} threads, "
          f"load average {statistics.median(loads):.1f} (medians of {a.rounds} rounds of {a.steps} steps)")
    print(f"{'part':40s} {'calls':>6s} {'MB':>9s} {'ms':>8s} {'GB/s':>7s} {'cpu ms':>7s}")
    rows = {}
    timed = 0.0
    total_mb = 0.0
    for k in keys:
        calls = statistics.median(p[k][0] for p in per_round)
        mb = statistics.median(p[k][1] for p in per_round) / 1e6
        kms = statistics.median(p[k][2] for p in per_round)
        cpu = statistics.median(p[k][3] for p in per_round)
        timed += kms
        total_mb += mb
        gbs = mb / kms if kms > 0 and mb > 0 else float("nan")
        rows[k] = {"calls": calls, "mb": mb, "ms": kms, "gbs": gbs, "cpu_ms": cpu}
        print(f"{k:40s} {calls:6.0f} {mb:9.2f} {kms:8.2f} {gbs:7.1f} {cpu:7.2f}")
    print(f"{'rest (engine, sampling, between calls)':40s} {'':6s} {'':9s} {ms - timed:8.2f}")
    print(f"{'total':40s} {'':6s} {total_mb:9.2f} {ms:8.2f} {total_mb / ms:7.1f}")
    emit_json("decode_bytes", {"model": a.model, "threads": a.threads, "ms_per_step": ms, "parts": rows,
                               "mb_per_step": total_mb, "load": statistics.median(loads)})
    llm.close()


if __name__ == "__main__":
    main()
