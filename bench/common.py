"""Shared helpers for the benchmarks: timing, tables, a JSON line, machine facts."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

_USER_SPIN = "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ
try:   # first: hitenter sets the OpenMP wait policy (hitenter/omp_wait.py) before torch loads libgomp
    import hitenter  # noqa: F401
except ImportError:   # a llama.cpp worker, under the llama-cpp-python venv's interpreter
    pass


def baseline_env() -> dict[str, str]:
    """The environment for a baseline engine's process (llama.cpp, llama-server): without the OpenMP spin
    count hitenter set for itself, so the baseline runs with its own defaults (a user's setting stays)."""
    env = dict(os.environ)
    if not _USER_SPIN:
        env.pop("GOMP_SPINCOUNT", None)
    return env


def llamacpp_env(lib: str | None = None) -> dict[str, str]:
    """baseline_env for a llama-cpp-python process; with `lib`, a folder holding another build's libllama.so
    and ggml libraries (bench/build_llamacpp_avx2.sh), llama-cpp-python loads that build instead of its own."""
    env = baseline_env()
    if lib:
        folder = os.path.abspath(lib)
        if not os.path.isfile(os.path.join(folder, "libllama.so")):
            raise SystemExit(f"--llamacpp-lib {lib}: no libllama.so in that folder")
        env["LLAMA_CPP_LIB_PATH"] = folder
        env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (folder, env.get("LD_LIBRARY_PATH")) if x)
    return env


def llamacpp_system_info(python: str, env: dict[str, str]) -> str:
    """llama_print_system_info() of the llama.cpp that `python` loads under `env` (its ISA flags)."""
    import subprocess

    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    return res.stdout.strip() if res.returncode == 0 else f"(system info failed: {res.stderr.strip()[-300:]})"


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine()}


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


def emit_json(name: str, result: dict[str, Any]) -> None:
    print("JSON " + json.dumps({"bench": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **machine(), **result}))


# hitenter weight formats the benches compare: LLM(...) keyword arguments per name. gguf is the default
# (dtype "auto": the file's own blocks, fp32 activations; dense fp32 where the native kernels are absent)
FORMATS: dict[str, dict[str, str]] = {"gguf": {}, "fp32": {"dtype": "float32"}, "bf16": {"dtype": "bfloat16"},
                                      "int4": {"quantization": "int4"}, "int8": {"quantization": "int8"}}


def rss_bytes() -> int:
    """This process's resident set size now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def decode_read_bytes(model: Any) -> int:
    """Weight bytes a decode step reads: all of them, less the embedding table unless the head's GEMM
    runs on the very same bytes (a tied head over a plain or block table). A lookup reads a row or two."""
    from hitenter.quant import weight_bytes

    total = weight_bytes(model)
    gemm = getattr(model.head, "coarse", model.head)   # a rescored quantized head reads its coarse layout
    gemm_ptrs = {t.data_ptr() for t in list(gemm.parameters()) + list(gemm.buffers()) if not t.is_mkldnn}
    embed = list(model.embed.parameters()) + list(model.embed.buffers())
    if any(t.data_ptr() in gemm_ptrs for t in embed):
        return total
    return total - weight_bytes(model.embed)


def cpu_line() -> str:
    """CPU model, the SIMD extensions that matter for the kernels, and the native qmatmul variant loaded."""
    from pathlib import Path

    from hitenter.kernels import native_isa

    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16") if f in flags]
    return f"CPU {model}; ISA {' '.join(isa) or '?'}; hitenter qmatmul {native_isa()}"
