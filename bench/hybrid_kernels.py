"""The recurrent kernels of the hybrid models on a synthetic GGUF (bench/synthetic_hybrid.py): hitenter with
its fused recurrent steps on and off, on the CPU's own ISA and forced to AVX2, beside llama.cpp, in
alternating rounds (each run a fresh process), medians.

    .venv/bin/python bench/synthetic_hybrid.py --shape qwen35-2b --out /work/models/qwen35-2b-syn.gguf
    .venv/bin/python bench/hybrid_kernels.py --model /work/models/qwen35-2b-syn.gguf --rounds 3 \
        [--configs native unfused avx2 avx2_unfused] [--decode 32] [--prefill 512] [--llamacpp-no-repack]

Configurations (environment of the hitenter process; hitenter/envs.py):

- ``native``: the defaults (the fused Gated DeltaNet / Mamba2 steps, every kernel on this CPU's ISA);
- ``unfused``: HITENTER_GDN_FUSED=0 HITENTER_MAMBA2_FUSED=0 (the layers' torch ops beside the delta rule /
  scan kernels);
- ``avx2`` / ``avx2_unfused``: the same with the quantized matmul, delta-rule and SSM kernels built
  ``-mno-avx512f`` (HITENTER_QMATMUL_ISA / HITENTER_DELTA_RULE_ISA / HITENTER_SSM_SCAN_ISA=avx2), torch's
  kernels at AVX2 (ATEN_CPU_CAPABILITY=avx2) and oneDNN capped at AVX2. The attention kernels have no ISA
  switch and stay on the CPU's own. llama.cpp runs on its own build (no AVX2 switch).

Each hitenter run is bench/vs_llamacpp.py's worker (decode tokens/s at batch 1, prefill tokens/s, best of
the last two of three repetitions), llama.cpp its script. The load average is printed beside every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_llamacpp  # noqa: E402
from common import cpu_line, emit_json, llamacpp_env, llamacpp_system_info  # noqa: E402

UNFUSED = {"HITENTER_GDN_FUSED": "0", "HITENTER_MAMBA2_FUSED": "0"}
AVX2 = {"HITENTER_QMATMUL_ISA": "avx2", "HITENTER_DELTA_RULE_ISA": "avx2", "HITENTER_SSM_SCAN_ISA": "avx2",
        "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CONFIGS = {"native": {}, "unfused": UNFUSED, "avx2": AVX2, "avx2_unfused": {**AVX2, **UNFUSED}}


def hitenter_run(model: str, env: dict[str, str], a: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, vs_llamacpp.__file__, "--one", model, "gguf", "--threads", str(a.threads),
           "--decode", str(a.decode), "--prefill", *map(str, a.prefill)]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if res.returncode:
        raise SystemExit(f"hitenter run failed ({env or 'defaults'}):\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF of a vocabulary of >= 40,000 tokens (the prompts' "
                    "ids; bench/synthetic_hybrid.py writes one)")
    ap.add_argument("--configs", nargs="+", default=["native", "unfused", "avx2"], choices=sorted(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prefill", type=int, nargs="+", default=[512])
    ap.add_argument("--no-llamacpp", action="store_true", help="hitenter's configurations only")
    ap.add_argument("--llamacpp-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--llamacpp-no-repack", action="store_true",
                    help="llama.cpp without its repacked CPU buffers (it segfaults with them on some AVX-512 + "
                         "AMX machines)")
    ap.add_argument("--llamacpp-lib", metavar="DIR", help="load llama.cpp from DIR/libllama.so (e.g. "
                    "bench/build_llamacpp_avx2.sh's AVX2-only build) instead of llama-cpp-python's own")
    a = ap.parse_args()
    cpu = cpu_line()
    print(cpu, f"| {a.threads} threads", flush=True)
    llamacpp_info = "" if a.no_llamacpp else llamacpp_system_info(a.llamacpp_python, llamacpp_env(a.llamacpp_lib))
    if llamacpp_info:
        print(f"llama.cpp ({a.llamacpp_lib or 'llama-cpp-python build'}): {llamacpp_info}", flush=True)
    names = [*a.configs, *([] if a.no_llamacpp else ["llama.cpp"])]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    loads: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.rounds):
        for name in names:
            loads[name].append(os.getloadavg()[0])
            out = (vs_llamacpp.llamacpp_rates(a.model, a) if name == "llama.cpp"
                   else hitenter_run(a.model, CONFIGS[name], a))
            runs[name].append(out)
            rates = {k: round(v, 2) for k, v in out.items() if k == "decode" or k.startswith("prefill")}
            print(f"round {r} {name:13s} {rates} load {loads[name][-1]:.1f}", flush=True)
    keys = ["decode"] + [f"prefill_{n}" for n in a.prefill]
    med = {n: {k: statistics.median(x[k] for x in runs[n] if k in x) for k in keys} for n in names if runs[n]}
    base = med.get("llama.cpp")
    print(f"\nmedians of {a.rounds} alternating rounds (tok/s; ratio to llama.cpp)")
    for n, m in med.items():
        cols = "  ".join(f"{k} {v:7.2f}" + (f" ({v / base[k]:.2f}x)" if base and n != "llama.cpp" else "")
                         for k, v in m.items())
        print(f"{n:13s} {cols}  load {statistics.median(loads[n]):.1f}")
    emit_json("hybrid_kernels", {"cpu": cpu, "model": a.model, "medians": med, "runs": runs, "loads": loads,
                                 "llamacpp_lib": a.llamacpp_lib, "llamacpp_system_info": llamacpp_info})


if __name__ == "__main__":
    main()
