"""Long prompts beside llama.cpp: prefill of 4,000-, 8,000- and 16,000-token prompts and decode at that
context, same GGUF, same threads, one invocation (issue 29).

    .venv/bin/python bench/long_context.py [--models qwen2.5-coder-1.5b-instruct] [--contexts 4000 8000 16000]
        [--decode 32] [--threads 2] [--rounds 1] [--kv-cache-dtype auto] [--llamacpp-python PATH] [--fa both|off|on|none]

Per model and context, each engine in a fresh process, in alternating order: hitenter (the engine as served:
its default chunked prefill, prefix caching off so every round computes the prompt), then llama.cpp
(llama-cpp-python, n_batch 512) with flash attention off and on. Prefill tokens/s = prompt tokens / time to
the first token; decode tokens/s = the next `--decode` tokens' rate at that context. Ratios are against
llama.cpp's faster setting per figure. With `--kv-cache-dtype q8_0` llama.cpp runs its q8_0 cache too
(type_k = type_v = q8_0, which it allows with flash attention only: fa off is skipped). Prints the CPU model
and ISA; a JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import baseline_env, cpu_line, emit_json, table  # noqa: E402

LLAMACPP_SCRIPT = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, n, decode, fa = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
q8 = dict(type_k=8, type_v=8) if sys.argv[6] == "q8_0" else {}   # GGML_TYPE_Q8_0
llm = Llama(model_path=path, n_ctx=n + decode + 16, n_threads=threads, n_threads_batch=threads, n_batch=512,
            flash_attn=fa, verbose=False, **q8)
toks = [100 + (i * 7919) % 40000 for i in range(n)]
t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter()
for i in range(decode): llm.eval([200 + i])
t2 = time.perf_counter()
print(json.dumps({"prefill": n / (t1 - t0), "decode": decode / (t2 - t1)}))
"""


def hitenter_run(path: str, n: int, decode: int, threads: int, kv_dtype: str) -> dict[str, float]:
    import torch

    from hitenter import LLM, SamplingParams
    from hitenter.models.gguf import model_config_from_metadata, read_gguf_metadata

    torch.set_num_threads(threads)
    cfg = model_config_from_metadata(read_gguf_metadata(path))
    total = n + decode + 16
    llm = LLM(path, enable_prefix_caching=False, max_model_len=total, kv_cache_dtype=kv_dtype,
              kv_cache_memory=cfg.kv_bytes_per_token(4) * (total + 64))
    toks = [100 + (i * 7919) % 40000 for i in range(n)]
    times: list[float] = []
    t0 = time.perf_counter()
    llm.generate([toks], SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True),
                 on_output=lambda o: times.append(time.perf_counter()))
    plan = llm.engine.plan
    llm.close()
    return {"prefill": n / (times[0] - t0), "decode": (len(times) - 1) / (times[-1] - times[0]),
            "kv_cache_dtype": plan.kv_cache_dtype, "kv_bytes_per_token": plan.kv_bytes_per_token}


def run_hitenter(path: str, n: int, a: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--one", path, str(n), "--decode", str(a.decode), "--threads", str(a.threads),
           "--kv-cache-dtype", a.kv_cache_dtype]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_llamacpp(path: str, n: int, fa: bool, a: argparse.Namespace) -> dict[str, float]:
    res = subprocess.run([a.llamacpp_python, "-c", LLAMACPP_SCRIPT, path, str(a.threads), str(n), str(a.decode),
                          "1" if fa else "0", a.kv_cache_dtype], capture_output=True, text=True, check=True, env=baseline_env())
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b-instruct"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4000, 8000, 16000])
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--llamacpp-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--fa", choices=["both", "off", "on", "none"], default="both",
                    help="llama.cpp's flash attention settings to run (none: hitenter alone, no ratio)")
    ap.add_argument("--one", nargs=2, metavar=("PATH", "N"), help=argparse.SUPPRESS)   # a worker run
    a = ap.parse_args()
    if a.one:
        print(json.dumps(hitenter_run(a.one[0], int(a.one[1]), a.decode, a.threads, a.kv_cache_dtype)))
        return
    from hitenter.models.registry import resolve_model

    cpu = cpu_line()
    print(cpu, f"| {a.threads} threads")
    have_llama = Path(a.llamacpp_python).exists()
    rows, results = [], {}
    for name in a.models:
        path = str(resolve_model(name))
        for n in a.contexts:
            runs: dict[str, list[dict[str, float]]] = {"hitenter": [], "fa_off": [], "fa_on": []}
            for _ in range(a.rounds):
                runs["hitenter"].append(run_hitenter(path, n, a))
                # llama.cpp quantizes V only with fa on
                if have_llama and a.kv_cache_dtype != "q8_0" and a.fa in ("both", "off"):
                    runs["fa_off"].append(run_llamacpp(path, n, False, a))
                if have_llama and a.fa in ("both", "on"):
                    runs["fa_on"].append(run_llamacpp(path, n, True, a))
            med = {k: {m: statistics.median(r[m] for r in v) for m in ("prefill", "decode")}
                   for k, v in runs.items() if v}
            best = {m: max((med[k][m] for k in ("fa_off", "fa_on") if k in med), default=0.0)
                    for m in ("prefill", "decode")}
            ours = med["hitenter"]
            ratio = {m: ours[m] / best[m] if best[m] else float("nan") for m in ("prefill", "decode")}
            kv = runs["hitenter"][0]
            rows.append([name, n, f"{kv['kv_cache_dtype']} {kv['kv_bytes_per_token']} B/tok",
                         f"{ours['prefill']:.1f} / {ours['decode']:.2f}",
                         *(f"{med[k]['prefill']:.1f} / {med[k]['decode']:.2f}" if k in med else "-"
                           for k in ("fa_off", "fa_on")),
                         f"{ratio['prefill']:.2f}x / {ratio['decode']:.2f}x"])
            print(table(rows[-1:], ["model", "prompt", "hitenter KV", "hitenter prefill / decode",
                                    "llama.cpp fa off", "llama.cpp fa on", "ratio vs faster"]), flush=True)
            results[f"{name}@{n}"] = {"runs": runs, "ratio": ratio}
    print(table(rows, ["model", "prompt", "hitenter KV", "hitenter prefill / decode", "llama.cpp fa off",
                       "llama.cpp fa on", "ratio vs faster"]))
    emit_json("long_context", {"cpu": cpu, "threads": a.threads, "results": results})


if __name__ == "__main__":
    main()
