"""hitenter beside llama.cpp (llama-cpp-python) on the same GGUFs, same workloads, one invocation.

    .venv/bin/python bench/vs_llamacpp.py [--models smollm2-135m-instruct qwen2.5-coder-1.5b-instruct]
        [--formats gguf fp32 bf16 int4] [--llamacpp-python /path/to/venv/bin/python] [--threads 2]

llama-cpp-python is a benchmark-only dependency, never a test one. Build it into its own venv once
(about 10 minutes on 2 cores):
    python3 -m venv /work/venvs/llamacpp && CMAKE_BUILD_PARALLEL_LEVEL=2 \
        /work/venvs/llamacpp/bin/pip install llama-cpp-python==0.3.36
Per model: decode tokens/s at batch 1 (128 tokens), prefill tokens/s at 512 and 2,000 prompt tokens,
the ratios, resident memory after load (RSS), a JSON line, and a roofline card (weight bytes read per
decode step, the bandwidth-bound ceiling at --bandwidth GB/s, and the % of it each engine reaches).
Every hitenter format runs in a fresh process (so its RSS is its own): gguf = the default, the file's
own blocks run by the native qmatmul (it falls back to dense fp32 without the native kernels: the row
then says "gguf->dense"); fp32 = dequantized; bf16 = weights and activations in bfloat16; int4 =
torch's int4 kernel on the Q4_0/Q4_1 blocks (other types requantized).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import FORMATS, cpu_line, decode_read_bytes, emit_json, llamacpp_env, rss_bytes, table  # noqa: E402

N_CTX = 4096   # llama.cpp's context below, and hitenter's KV cache
DEFAULT_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct"]   # gemma-3-270m also runs (--models)
LLAMACPP_SCRIPT = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, decode, prefills = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
if sys.argv[5:] == ["no-repack"]:   # llama.cpp's extra (repacked) CPU buffer types off
    import llama_cpp, llama_cpp.llama as lm
    defaults = llama_cpp.llama_model_default_params
    def params():
        p = defaults(); p.use_extra_bufts = False; return p
    lm.llama_cpp.llama_model_default_params = params
llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
rss = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
out = {"rss_after_load": rss}
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


def hitenter_rates(path: str, fmt: str, decode: int, prefills: list[int]) -> dict[str, object]:
    """One weight format's rates, RSS after load, and weight bytes (resident / read per decode step)."""
    from hitenter import LLM, SamplingParams
    from hitenter.models.gguf import model_config_from_metadata, read_gguf_metadata

    # a KV cache for llama.cpp's n_ctx=4096 tokens (the engine's default is a share of RAM, which would
    # dominate the RSS), in the format's activation dtype
    mcfg = model_config_from_metadata(read_gguf_metadata(path))
    kv_bytes = mcfg.kv_bytes_per_token(2 if fmt == "bf16" else 4) * N_CTX
    # a hybrid model's recurrent state slots are counted in kv_cache_memory: one running sequence, default budget
    budget = {"max_num_seqs": 1} if mcfg.layer_types else {"kv_cache_memory": kv_bytes}
    llm = LLM(path, enable_prefix_caching=False, max_num_batched_tokens=max(prefills), max_model_len=N_CTX,
              **budget, **FORMATS[fmt])
    kv = sum(getattr(t, "nbytes", 0) for t in llm.engine.parts.runner.kv_caches)   # KV tensors and state caches
    out: dict[str, object] = {"rss_after_load": rss_bytes(), "kv_bytes": kv}
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
    out.update(weight_bytes=model.weight_bytes(), read_bytes=decode_read_bytes(model),
               loaded=getattr(model, "weight_format", "dense"))
    llm.close()
    return out


def run_isolated(path: str, fmt: str, a: argparse.Namespace) -> dict[str, object]:
    """hitenter_rates in a fresh interpreter (its own RSS; nothing left over from another format)."""
    cmd = [sys.executable, __file__, "--one", path, fmt, "--threads", str(a.threads), "--decode", str(a.decode),
           "--prefill", *map(str, a.prefill)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def llamacpp_rates(path: str, a: argparse.Namespace) -> dict[str, float]:
    if not Path(a.llamacpp_python).exists():
        print(f"llama-cpp-python not found at {a.llamacpp_python}; see this script's docstring", file=sys.stderr)
        return {}
    res = subprocess.run([a.llamacpp_python, "-c", LLAMACPP_SCRIPT, path, str(a.threads), str(a.decode),
                          json.dumps(a.prefill), *(["no-repack"] if a.llamacpp_no_repack else [])],
                         capture_output=True, text=True, check=True,
                         env=llamacpp_env(getattr(a, "llamacpp_lib", None)))
    return json.loads(res.stdout.strip().splitlines()[-1])


def report(name: str, path: str, ours: dict[str, dict], theirs: dict[str, float], a: argparse.Namespace) -> None:
    """The rates table, memory and roofline card of one model."""
    keys = ["decode"] + [f"prefill_{n}" for n in a.prefill]

    def label(fmt: str, r: dict) -> str:
        return f"{fmt}->{r['loaded']}" if fmt == "gguf" and r["loaded"] != "gguf" else fmt

    rows = [[f"{k} [{label(fmt, r)}]", r[k], theirs.get(k, float("nan")),
             r[k] / theirs[k] if k in theirs else float("nan")] for k in keys for fmt, r in ours.items()]
    print(f"\n== {name}")
    print(table(rows, ["workload (tok/s) [hitenter format]", "hitenter", "llama.cpp", "ratio"]))
    mem = [[label(fmt, r), r["rss_after_load"] / 1e6, r["weight_bytes"] / 1e6, r["kv_bytes"] / 1e6]
           for fmt, r in ours.items()]
    if theirs:
        mem.append(["llama.cpp", theirs["rss_after_load"] / 1e6, float("nan"), float("nan")])
    print(table(mem, ["engine [format]", "RSS after load (MB)", "weights resident (MB)", f"KV cache, {N_CTX} tokens"]))
    gguf_bytes = Path(path).stat().st_size
    ceil_gguf = a.bandwidth * 1e9 / gguf_bytes
    for fmt, r in ours.items():
        ceil = a.bandwidth * 1e9 / r["read_bytes"]
        print(f"roofline [{label(fmt, r)}]: hitenter reads {r['read_bytes'] / 1e6:.0f} MB of weights per decode "
              f"step -> ceiling {ceil:.0f} tok/s at {a.bandwidth} GB/s; achieved {100 * r['decode'] / ceil:.0f}%.")
    print(f"The GGUF is {gguf_bytes / 1e6:.0f} MB -> ceiling {ceil_gguf:.0f} tok/s for a quantized reader"
          + (f"; llama.cpp achieves {100 * theirs['decode'] / ceil_gguf:.0f}% of it." if theirs else "."))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--llamacpp-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llamacpp-no-repack", action="store_true",
                    help="llama.cpp without its repacked CPU buffers (this llama.cpp segfaults with them on some "
                         "AVX-512 + AMX machines)")
    ap.add_argument("--llamacpp-lib", metavar="DIR", help="load llama.cpp from DIR/libllama.so (another build, "
                    "e.g. bench/build_llamacpp_avx2.sh's AVX2-only one) instead of llama-cpp-python's own")
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--prefill", type=int, nargs="+", default=[512, 2000])
    ap.add_argument("--bandwidth", type=float, default=31.0, help="GB/s read bandwidth of this machine")
    ap.add_argument("--formats", nargs="+", default=["gguf", "fp32", "bf16", "int4"], choices=sorted(FORMATS))
    ap.add_argument("--one", nargs=2, metavar=("PATH", "FORMAT"), help=argparse.SUPPRESS)   # a worker run
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    if a.one:
        print(json.dumps(hitenter_rates(a.one[0], a.one[1], a.decode, a.prefill)))
        return
    from hitenter.models.registry import resolve_model

    cpu = cpu_line()
    print(cpu, f"| {a.threads} threads")
    results: dict[str, dict] = {}
    for name in a.models:
        path = str(resolve_model(name))
        ours = {fmt: run_isolated(path, fmt, a) for fmt in a.formats}
        theirs = llamacpp_rates(path, a)
        report(name, path, ours, theirs, a)
        results[name] = {"hitenter": ours, "llamacpp": theirs, "gguf_bytes": Path(path).stat().st_size}
    emit_json("vs_llamacpp", {"cpu": cpu, "models": results})


if __name__ == "__main__":
    main()
