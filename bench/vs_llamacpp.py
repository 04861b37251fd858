"""hitenter beside llama.cpp (llama-cpp-python) on the same GGUF, same workloads, one invocation.

    .venv/bin/python bench/vs_llamacpp.py [--llamacpp-python /path/to/venv/bin/python] [--threads 2]
        [--model smollm2-135m-instruct gemma-3-270m]   (one report per model; MODELS lists the known ones)

llama-cpp-python is a benchmark-only dependency, never a test one. Build it into its own venv once
(about 10 minutes on 2 cores):
    python3 -m venv /work/venvs/llamacpp && CMAKE_BUILD_PARALLEL_LEVEL=2 \
        /work/venvs/llamacpp/bin/pip install llama-cpp-python==0.3.36
Prints decode tokens/s at batch 1 (128 tokens), prefill tokens/s at 512 and 2,000 prompt tokens,
the ratios, a JSON line, and a roofline card (weight bytes read per decode step, the bandwidth-bound
ceiling at --bandwidth GB/s, and the % of it each engine reaches). `--formats fp32 bf16 int4` runs
hitenter once per weight format (fp32 = the default dequantized model; bf16 = weights and activations
in bfloat16; int4 = the GGUF's Q4_1 blocks kept packed, as llama.cpp runs them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import FORMATS, emit_json, table  # noqa: E402

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")   # architectures reported beside llama.cpp

LLAMACPP_SCRIPT = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, decode, prefills = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
out = {}
for n in prefills:
    best = 0.0
    for r in range(3):
        llm.reset()
        toks = [100 + (i * 7919) % 40000 for i in range(n)]
        t0 = time.perf_counter(); llm.eval(toks); dt = time.perf_counter() - t0
        if r: best = max(best, n / dt)
    out[f"prefill_{n}"] = best
best = 0.0
for r in range(3):
    llm.reset(); llm.eval([100 + i for i in range(16)])
    t0 = time.perf_counter()
    for i in range(decode): llm.eval([200 + i])
    if r: best = max(best, decode / (time.perf_counter() - t0))
out["decode"] = best
print(json.dumps(out))
"""


def hitenter_rates(model: str, decode: int, prefills: list[int], fmt: str) -> tuple[dict[str, float], int]:
    """Rates of one weight format, and the bytes of weights it reads per decode step."""
    from hitenter import LLM, SamplingParams

    llm = LLM(model, enable_prefix_caching=False, max_num_batched_tokens=max(prefills), **FORMATS[fmt])
    out: dict[str, float] = {}
    for n in prefills:
        best = 0.0
        for r in range(3):
            toks = [100 + (i * 7919 + r) % 40000 for i in range(n)]
            t0 = time.perf_counter()
            llm.generate([toks], SamplingParams(temperature=0, max_tokens=1))
            if r:
                best = max(best, n / (time.perf_counter() - t0))
        out[f"prefill_{n}"] = best
    best = 0.0
    for r in range(3):
        times: list[float] = []
        llm.generate([list(range(100, 116))], SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True),
                     on_output=lambda o, t=times: t.append(time.perf_counter()))
        if r:
            best = max(best, (len(times) - 1) / (times[-1] - times[0]))
    out["decode"] = best
    model = llm.engine.parts.model
    wb = model.weight_bytes()
    if getattr(model.head, "packed", None) is not None:   # a dense head packed apart: decode does not read
        wb -= model.embed.weight.numel() * model.embed.weight.element_size()   # the embedding's plain table
    llm.close()
    return out, wb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", default=[MODELS[0]], help=f"one or more of {MODELS} (or GGUF paths)")
    ap.add_argument("--llamacpp-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--prefill", type=int, nargs="+", default=[512, 2000])
    ap.add_argument("--bandwidth", type=float, default=31.0, help="GB/s read bandwidth of this machine")
    ap.add_argument("--formats", nargs="+", default=["fp32", "bf16", "int4"], choices=sorted(FORMATS))
    a = ap.parse_args()
    import torch

    from hitenter.models.registry import resolve_model

    torch.set_num_threads(a.threads)
    for model in a.model:
        print(f"== {model}")
        report(str(resolve_model(model)), a)


def report(path: str, a: argparse.Namespace) -> None:
    """Run both engines on one GGUF and print the table, the roofline card and the JSON line."""
    ours = {fmt: hitenter_rates(path, a.decode, a.prefill, fmt) for fmt in a.formats}
    theirs: dict[str, float] = {}
    if Path(a.llamacpp_python).exists():
        res = subprocess.run([a.llamacpp_python, "-c", LLAMACPP_SCRIPT, path, str(a.threads), str(a.decode),
                              json.dumps(a.prefill)], capture_output=True, text=True, check=True)
        theirs = json.loads(res.stdout.strip().splitlines()[-1])
    else:
        print(f"llama-cpp-python not found at {a.llamacpp_python}; see this script's docstring", file=sys.stderr)
    keys = ["decode"] + [f"prefill_{n}" for n in a.prefill]
    rows = [[f"{k} [{fmt}]", rates[k], theirs.get(k, float("nan")),
             rates[k] / theirs[k] if k in theirs else float("nan")]
            for k in keys for fmt, (rates, _) in ours.items()]
    print(table(rows, ["workload (tok/s) [hitenter format]", "hitenter", "llama.cpp", "ratio"]))
    gguf_bytes = Path(path).stat().st_size
    ceil_gguf = a.bandwidth * 1e9 / gguf_bytes
    for fmt, (rates, wb) in ours.items():
        ceil_ours = a.bandwidth * 1e9 / wb
        print(f"roofline [{fmt}]: hitenter reads {wb / 1e6:.0f} MB of weights per decode step -> ceiling "
              f"{ceil_ours:.0f} tok/s at {a.bandwidth} GB/s; achieved {100 * rates['decode'] / ceil_ours:.0f}%.")
    print(f"The GGUF is {gguf_bytes / 1e6:.0f} MB -> ceiling {ceil_gguf:.0f} tok/s for a quantized reader"
          + (f"; llama.cpp achieves {100 * theirs['decode'] / ceil_gguf:.0f}% of it." if theirs else "."))
    emit_json("vs_llamacpp", {"model": Path(path).stem, "hitenter": {f: r for f, (r, _) in ours.items()}, "llamacpp": theirs,
                              "weight_bytes": {f: wb for f, (_, wb) in ours.items()}, "gguf_bytes": gguf_bytes})


if __name__ == "__main__":
    main()
