"""Where a prefill's CPU time goes: perf samples of N prompts of --tokens tokens, by function, grouped.

    .venv/bin/python bench/prefill_profile.py [--model smollm2-135m-instruct] [--tokens 512] [--reps 4]
        [--threads 1]

The engine loads and warms up outside the measurement; perf (`perf record -e cpu-clock`, enabled through
its control FIFO only around the measured prompts) samples every thread, and the table gives each
function's share and its CPU time per prompt (share x the process CPU time per prompt), grouped into the
GEMM kernels (the packed / repacked / row-path kernel of each block type: pk_* / rk_* / row_*), the prompt
attention, the fused layer's glue (dl_layer, its OpenMP regions), activation quantization, OpenMP waiting
(libgomp) and the rest. --threads 1 measures the work itself (no spinning threads); with 2, libgomp's
share is time a thread waited. CPU time, so a shared machine inflates the figures little; say the CPU
(printed first) with them. Needs `perf` (linux-tools) and perf_event_paranoid <= 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line  # noqa: E402

GROUPS = [("GEMM", re.compile(r"^(pk_|rk_|row_|run_|pack8|tile_rows)")), ("attention", re.compile(r"prompt_item|prompt_attention|decode_item")),
          ("fused glue", re.compile(r"dl_layer|block_out|pre_norm|attention_part|rmsnorm|glu")),
          ("quantize x", re.compile(r"quant_row")), ("OpenMP wait", re.compile(r"libgomp|GOMP|gomp"))]


def worker(a: argparse.Namespace) -> None:
    """Load, warm up, then enable perf (its control FIFO) for the measured prompts; prints a JSON line."""
    import torch

    torch.set_num_threads(a.threads)
    from hitenter import LLM, SamplingParams
    from hitenter.models.gguf import model_config_from_metadata, read_gguf_metadata
    from hitenter.models.registry import resolve_model

    path = str(resolve_model(a.model))
    kv = model_config_from_metadata(read_gguf_metadata(path)).kv_bytes_per_token(4) * 4096
    llm = LLM(path, enable_prefix_caching=False, max_num_batched_tokens=a.tokens, max_model_len=4096,
              kv_cache_memory=kv)

    def prompt(r: int) -> None:
        toks = [100 + (i * 7919 + r) % 40000 for i in range(a.tokens)]
        llm.generate([toks], SamplingParams(temperature=0, max_tokens=1))

    for r in range(2):
        prompt(r)
    with open(a.ctl, "w") as f:
        f.write("enable\n")
    c0, w0 = time.process_time(), time.perf_counter()
    for r in range(a.reps):
        prompt(r + 2)
    c1, w1 = time.process_time(), time.perf_counter()
    with open(a.ctl, "w") as f:
        f.write("disable\n")
    print(json.dumps({"cpu_s": (c1 - c0) / a.reps, "wall_s": (w1 - w0) / a.reps}))


def report(data: str, cpu_s: float) -> None:
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol", "--stdio",
                          "-g", "none", "--percent-limit", "0.2"], capture_output=True, text=True, check=True).stdout
    rows: list[tuple[float, str, str]] = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(\S+)", line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3)))
    groups: dict[str, float] = defaultdict(float)
    print(f"{'share':>7}  {'ms/prompt':>9}  function (library)")
    for pct, dso, sym in rows:
        name = sym if not sym.startswith("0x") else dso
        group = next((g for g, rx in GROUPS if rx.search(name) or rx.search(dso)), "other")
        groups[group] += pct
        print(f"{pct:6.2f}%  {pct / 100 * cpu_s * 1e3:9.1f}  {sym} ({dso})")
    print("\nby group:")
    for g, pct in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{pct:6.2f}%  {pct / 100 * cpu_s * 1e3:9.1f} ms  {g}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctl", help=argparse.SUPPRESS)   # the worker's perf control FIFO
    a = ap.parse_args()
    if a.ctl:
        worker(a)
        return
    print(cpu_line(), f"| {a.threads} threads | {a.model}, {a.tokens}-token prompts x {a.reps}")
    with tempfile.TemporaryDirectory() as d:
        ctl, data = os.path.join(d, "ctl"), os.path.join(d, "perf.data")
        os.mkfifo(ctl)
        cmd = ["perf", "record", "-q", "-F", "1999", "-e", "cpu-clock", "-g", "-D", "-1", f"--control=fifo:{ctl}",
               "-o", data, "--", sys.executable, __file__, "--model", a.model, "--tokens", str(a.tokens),
               "--reps", str(a.reps), "--threads", str(a.threads), "--ctl", ctl]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        got = json.loads(next(ln for ln in reversed(res.stdout.splitlines()) if ln.startswith("{")))
        print(f"per prompt: {got['cpu_s'] * 1e3:.0f} ms CPU, {got['wall_s'] * 1e3:.0f} ms wall "
              f"({a.tokens / got['wall_s']:.0f} tok/s wall)\n")
        report(data, got["cpu_s"])


if __name__ == "__main__":
    main()
