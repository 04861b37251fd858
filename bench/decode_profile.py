"""Where a batch-1 decode step's time goes, per layer: torch.profiler over engine decode steps.

    .venv/bin/python bench/decode_profile.py [--model smollm2-135m-instruct] [--format gguf] [--steps 32]

The native quantized matmuls are ctypes calls, invisible to the profiler as ops, so BlockLinear /
Linear forwards are wrapped in record_function ranges ("linear:<name>") here (only in this script).
Prints ms per step, the top ops by self CPU time, the number of op calls per layer per step, and the
share of the step outside the linears (the "few calls per layer" overhead of issue 16).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import FORMATS, emit_json  # noqa: E402


def wrap_linears(model) -> None:  # type: ignore[no-untyped-def]
    """Run every linear-like module's forward inside a named profiler range."""
    import torch

    for name, m in model.named_modules():
        if type(m).__name__ in ("BlockLinear", "Linear", "Int4Linear", "Int8Linear"):
            fwd = m.forward
            label = "linear:" + name.split(".")[-1]
            m.forward = lambda x, f=fwd, lb=label: _ranged(torch, lb, f, x)


def _ranged(torch, label, f, x):  # type: ignore[no-untyped-def]
    with torch.profiler.record_function(label):
        return f(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--format", default="gguf", choices=sorted(FORMATS))
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=25)
    a = ap.parse_args()
    import torch

    from hitenter import LLM, SamplingParams

    torch.set_num_threads(a.threads)
    llm = LLM(a.model, enable_prefix_caching=False, **FORMATS[a.format])
    model = llm.engine.parts.model
    wrap_linears(model)
    sp = SamplingParams(temperature=0, max_tokens=a.steps, ignore_eos=True)
    llm.generate([list(range(100, 116))], sp)                      # warm-up
    t0 = time.perf_counter()
    llm.generate([list(range(100, 116))], sp)
    ms = (time.perf_counter() - t0) / a.steps * 1e3
    with torch.profiler.profile() as prof:
        llm.generate([list(range(100, 116))], sp)
    ev = prof.key_averages()
    print(f"{a.model} [{getattr(model, 'weight_format', a.format)}]: {ms:.2f} ms per decode step (unprofiled)")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=a.rows))
    layers = len(model.layers)
    total = sum(e.self_cpu_time_total for e in ev)
    linear = sum(e.cpu_time_total for e in ev if e.key.startswith("linear:"))
    aten_calls = sum(e.count for e in ev if e.key.startswith("aten::"))
    steps = a.steps
    print(f"per step: {aten_calls / steps:.0f} aten op calls ({aten_calls / steps / layers:.1f} per layer); "
          f"linears {linear / steps / 1e3:.2f} ms, everything else {(total - linear) / steps / 1e3:.2f} ms "
          f"({(total - linear) / steps / layers:.0f} us per layer)")
    emit_json("decode_profile", {"model": a.model, "format": a.format, "ms_per_step": ms,
                                 "aten_calls_per_step": aten_calls / steps,
                                 "linear_ms_per_step": linear / steps / 1e3,
                                 "other_ms_per_step": (total - linear) / steps / 1e3})
    llm.close()


if __name__ == "__main__":
    main()
