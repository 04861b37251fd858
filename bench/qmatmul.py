"""Native GGUF-block matmul (hitenter.kernels.qmatmul) on the real model shapes, in one run:

    .venv/bin/python bench/qmatmul.py [--threads 2] [--pool-mb 256] [--quick] [--cpu-time] [--synthetic]
        [--m 512] [--types Q4_K Q2_K Q3_K IQ4_NL IQ4_XS MXFP4]

GEMV (M=1): effective GB/s = weight bytes / time, cycling through copies of the model's tensors of that
shape whose total (--pool-mb) is far above the last-level cache, so every call streams from DRAM; the
percentage is of torch's read bandwidth measured in the same run (sum of a 1 GiB fp32 tensor).
GEMM (M=512, prefill): GFLOP/s = 2 M N K / time, beside torch bf16 F.linear on the same shape.
--cpu-time (with --threads 1): time by the thread's CPU clock instead of the wall clock, for a shared,
oversubscribed machine where wall times mostly measure the other tenants (all columns alike).
--synthetic: SmolLM2-135M's shapes and types (Q4_1 layers, Q8_0 head) from random weights quantized by
gguf, for machines without that model cached. --types: each block type named on Qwen2.5-1.5B's layer shapes
(TYPE_SHAPES) from random valid blocks (gguf's quantizer where it has one), one type beside another; e.g.
`--types Q4_K Q2_K Q3_K IQ4_NL IQ4_XS MXFP4 --m 16`. Per call: us for a 1-row call on a 576x576 Q4_1 weight
(tight loop, out=), i.e. mostly the Python + ctypes overhead of a decode-step matmul.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402

MODELS = Path.home() / ".cache" / "hitenter" / "models"
# (model, tensor name suffix, label): one row per distinct shape/type of the decoder
SHAPES = [("qwen2.5-coder-1.5b-instruct", "attn_q.weight", "q/o 1536x1536"),
          ("qwen2.5-coder-1.5b-instruct", "attn_k.weight", "k 256x1536"),
          ("qwen2.5-coder-1.5b-instruct", "attn_v.weight", "v 256x1536"),
          ("qwen2.5-coder-1.5b-instruct", "ffn_up.weight", "up/gate 8960x1536"),
          ("qwen2.5-coder-1.5b-instruct", "ffn_down.weight", "down 1536x8960"),
          ("qwen2.5-coder-1.5b-instruct", "output.weight", "head 151936x1536"),
          ("smollm2-135m-instruct", "attn_q.weight", "q/o 576x576"),
          ("smollm2-135m-instruct", "attn_k.weight", "k/v 192x576"),
          ("smollm2-135m-instruct", "ffn_up.weight", "up/gate 1536x576"),
          ("smollm2-135m-instruct", "ffn_down.weight", "down 576x1536"),
          ("smollm2-135m-instruct", "token_embd.weight", "head 49152x576")]


SYNTHETIC = [("smollm2* q/o 576x576", "Q4_1", 576, 576), ("smollm2* k/v 192x576", "Q4_1", 192, 576),
             ("smollm2* up/gate 1536x576", "Q4_1", 1536, 576), ("smollm2* down 576x1536", "Q4_1", 576, 1536),
             ("smollm2* head 49152x576", "Q8_0", 49152, 576)]


# (label, N, K) of the --types rows: Qwen2.5-1.5B's decoder matrices (K a multiple of 256 for every type)
TYPE_SHAPES = [("q/o 1536x1536", 1536, 1536), ("up/gate 8960x1536", 8960, 1536), ("down 1536x8960", 1536, 8960)]
# gguf-py quantizes these (MXFP4 too, but through a [blocks, 32, 16] error array: GBs at these shapes)
GGUF_QUANTIZES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def synthetic_weight(type_name: str, n: int, k: int):
    """[n, k] in `type_name`: gguf's quantization of normal weights where it has one, else random valid
    blocks (hitenter.testing.tiny_model.random_kquant; MXFP4: random codes, block exponent 118)."""
    import gguf
    import numpy as np

    from hitenter.kernels import BlockWeight
    from hitenter.testing.tiny_model import random_kquant

    qtype = gguf.GGMLQuantizationType[type_name]
    rng = np.random.default_rng(0)
    if type_name in GGUF_QUANTIZES:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.02, qtype)
    elif type_name == "MXFP4":
        raw = rng.integers(0, 256, size=(n, k // 32, 17), dtype=np.uint8)
        raw[..., 0] = 118
    else:
        raw = random_kquant(qtype, n, k, rng)
    return BlockWeight(torch.from_numpy(np.ascontiguousarray(raw).reshape(n, -1)), int(qtype), (n, k))


def per_call_us(calls: int = 20000) -> float:
    """us per qmatmul of 1 row on a 576x576 Q4_1 weight into out= (best of 5 loops)."""
    from hitenter.kernels import qmatmul

    w = synthetic_weight("Q4_1", 576, 576)
    x, out = torch.randn(1, 576), torch.empty(1, 576)
    for _ in range(200):
        qmatmul(x, w, out=out)
    return best_time(lambda: [qmatmul(x, w, out=out) for _ in range(calls)], 5) / calls * 1e6


def cpu_info() -> tuple[str, str]:
    text = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    keep = [f for f in flags if f.startswith(("avx", "fma", "f16c", "amx"))]
    return model, " ".join(keep)


CLOCK: list[Callable[[], float]] = [time.perf_counter]


def best_time(fn: Callable[[], object], repeats: int) -> float:
    clock = CLOCK[0]
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def read_bandwidth() -> float:
    """GB/s of torch summing a 1 GiB fp32 tensor (the roofline the GEMV is compared to)."""
    a = torch.ones(256 * 1024 * 1024)
    a.sum()
    gbs = a.numel() * 4 / best_time(a.sum, 5) / 1e9
    del a
    return gbs


def load_weights(model: str, suffix: str) -> list:
    import gguf

    from hitenter.kernels import block_weight_from_gguf

    reader = gguf.GGUFReader(MODELS / f"{model}.gguf")
    return [block_weight_from_gguf(t) for t in reader.tensors if t.name.split(".", 2)[-1] == suffix
            or t.name == suffix]


def weight_pool(ws: list, pool_bytes: int) -> list:
    """Copies of the layers' tensors (cycled) until the pool exceeds pool_bytes: no call hits cache."""
    from hitenter.kernels import BlockWeight

    pool, total, i = [], 0, 0
    while total < pool_bytes or not pool:
        w = ws[i % len(ws)]
        pool.append(BlockWeight(w.data.clone(), w.qtype, w.shape) if len(ws) * w.nbytes() < pool_bytes else w)
        total += w.nbytes()
        i += 1
    return pool


def gemv(pool: list, reps: int) -> float:
    """GB/s streaming every weight of the pool once per repetition with M=1."""
    from hitenter.kernels import qmatmul

    x = torch.randn(1, pool[0].shape[1])
    outs = [torch.empty(1, w.shape[0]) for w in pool]
    for w, o in zip(pool, outs, strict=True):
        qmatmul(x, w, out=o)

    def once() -> None:
        for w, o in zip(pool, outs, strict=True):
            qmatmul(x, w, out=o)
    return sum(w.nbytes() for w in pool) / best_time(once, reps) / 1e9


def gemm(w, m: int, reps: int) -> tuple[float, float]:
    """GFLOP/s of qmatmul and of torch bf16 F.linear, [m, K] x [N, K]^T."""
    from hitenter.kernels import qmatmul

    n, k = w.shape
    flops = 2.0 * m * n * k
    x = torch.randn(m, k)
    out = torch.empty(m, n)
    qmatmul(x, w, out=out)
    q = flops / best_time(lambda: qmatmul(x, w, out=out), reps) / 1e9
    xb, wb = x.bfloat16(), torch.randn(n, k, dtype=torch.bfloat16)
    F.linear(xb, wb)
    b = flops / best_time(lambda: F.linear(xb, wb), reps) / 1e9
    return q, b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pool-mb", type=int, default=256)
    ap.add_argument("--m", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="skip the GEMMs of the two vocabulary heads")
    ap.add_argument("--cpu-time", action="store_true", help="thread CPU clock (needs --threads 1)")
    ap.add_argument("--synthetic", action="store_true", help="also SmolLM2's shapes from random quantized weights")
    ap.add_argument("--types", nargs="*", default=[], metavar="TYPE",
                    help="also these block types on TYPE_SHAPES from random weights (e.g. Q4_K Q2_K MXFP4)")
    ap.add_argument("--no-models", action="store_true", help="skip the cached models' tensors")
    a = ap.parse_args()
    if a.cpu_time:
        if a.threads != 1:
            ap.error("--cpu-time measures the calling thread only: use --threads 1")
        CLOCK[0] = time.thread_time
    torch.set_num_threads(a.threads)
    from hitenter.kernels.qmatmul import native_isa

    model, flags = cpu_info()
    print(f"CPU: {model} ({os.cpu_count()} cpus); flags: {flags}")
    print(f"qmatmul variant: {native_isa()}, threads {a.threads}, load average {os.getloadavg()[0]:.1f}, "
          f"clock {'thread CPU' if a.cpu_time else 'wall'}")
    bw = read_bandwidth()
    print(f"torch read bandwidth (sum of 1 GiB fp32, {a.threads} threads): {bw:.1f} GB/s")
    us = per_call_us()
    print(f"per call (1 x 576 @ Q4_1 576x576, out=): {us:.2f} us")
    rows, result = [], {}
    jobs = [] if a.no_models else [(mdl, suffix, label) for mdl, suffix, label in SHAPES
                                   if (MODELS / f"{mdl}.gguf").exists()]
    if a.synthetic:
        jobs += [(None, spec, spec[0]) for spec in SYNTHETIC]
    jobs += [(None, (f"{t} {label}", t, n, k), f"{t} {label}") for label, n, k in TYPE_SHAPES for t in a.types]
    for mdl, suffix, label in jobs:
        ws = load_weights(mdl, suffix) if mdl else [synthetic_weight(*suffix[1:])]
        if not ws:
            continue
        w = ws[0]
        gbs = gemv(weight_pool(ws, a.pool_mb << 20), reps=3)
        head = w.shape[0] > 40000
        q, b = (float("nan"), float("nan")) if a.quick and head else gemm(w, a.m, 1 if head else 3)
        name = f"{mdl.split('-')[0]} {label}" if mdl else label
        rows.append([name, w.type_name, gbs, 100 * gbs / bw, q, b, q / b])
        result[name] = {"type": w.type_name, "gemv_gbs": gbs, "gemv_pct_bw": 100 * gbs / bw, "gemm_gflops": q,
                        "bf16_gflops": b}
        print(table(rows[-1:], ["shape", "type", "M=1 GB/s", "% bw", f"M={a.m} GF/s", "bf16 GF/s", "ratio"])
              .splitlines()[-1], flush=True)
    print()
    print(table(rows, ["shape", "type", "M=1 GB/s", "% bw", f"M={a.m} GF/s", "bf16 GF/s", "ratio"]))
    emit_json("qmatmul", {"threads": a.threads, "per_call_us": us, "cpu_time": a.cpu_time, "read_gbs": bw, "isa": native_isa(), "rows": result})


if __name__ == "__main__":
    main()
