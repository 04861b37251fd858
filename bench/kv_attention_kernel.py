"""The decode and prompt attention kernels' CPU time per KV cache type (fp32 / f16 / bf16 / q8_0), side by side.

    .venv/bin/python bench/kv_attention_kernel.py [--ctx 4000] [--prompt 1024] [--rounds 7] [--threads 1]
                                                  [--dtypes float32,float16,q8_0] [--shape 12,2,128]

Decode: one row at `--ctx` keys, the shape's query / KV heads and head_dim (default Qwen2.5-1.5B's 12 x 128,
2 KV heads), 20 calls per sample. Prompt: `--prompt` rows of one sequence over their own keys (one call per
sample; 0 skips it). Each round times every cache type once in turn (alternating, so load drift on a shared
machine hits them alike); the table gives the median CPU time (time.process_time, all threads) per call and
the ratio to the first type. Prints the CPU, its ISA flags and the kernels' path (AVX2 or portable)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line, table  # noqa: E402


def kernel_path() -> str:
    """Which attention code this CPU's build compiles (csrc/attention/decode_attention.c: attn_avx2.h or the 16-lane code)."""
    try:
        flags = set(next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        flags = set()
    return "AVX2 attention kernels" if {"avx2", "fma"} <= flags and "avx512f" not in flags else "portable kernels"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=4000)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", default="float32,float16,q8_0")
    ap.add_argument("--shape", default="12,2,128", help="query heads, KV heads, head_dim")
    a = ap.parse_args()

    import torch

    from hitenter.models import decode_kernel, kv_q8_0, prompt_kernel
    from hitenter.models.attention import AttentionMetadata
    from hitenter.models.kv_dtype import Q8_0, TORCH_KV_DTYPES

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    h, kvh, d = (int(x) for x in a.shape.split(","))
    bs, names = 16, a.dtypes.split(",")
    n = max(a.ctx, a.prompt)
    nb = -(-n // bs)
    base = torch.randn(2, kvh, nb, bs, d)
    caches = {m: kv_q8_0.quantize(base) if TORCH_KV_DTYPES[m] == Q8_0 else base.to(TORCH_KV_DTYPES[m])
              for m in names}
    q1 = torch.randn(1, h, d)
    ctx, starts, tables = torch.tensor([a.ctx]), torch.tensor([0]), torch.randperm(nb)
    qp = torch.randn(a.prompt, h, d)
    meta = AttentionMetadata([0, a.prompt], [a.prompt], [tables.tolist()], torch.arange(a.prompt), bs)

    def decode(m: str) -> float:
        t0 = time.process_time()
        for _ in range(20):
            decode_kernel.decode_attention(q1, caches[m], ctx, starts, tables, d ** -0.5)
        return (time.process_time() - t0) / 20

    def prompt(m: str) -> float:
        out = torch.empty_like(qp)
        t0 = time.process_time()
        prompt_kernel.prompt_attention(qp, out, caches[m], meta, d ** -0.5, None, False)
        return time.process_time() - t0

    kinds = [("decode", decode)] + ([("prompt", prompt)] if a.prompt else [])
    samples: dict[tuple[str, str], list[float]] = {(k, m): [] for k, _ in kinds for m in names}
    for _, f in kinds:
        for m in names:
            f(m)   # warm: the build, the pages
    for _ in range(a.rounds):
        for k, f in kinds:
            for m in names:
                samples[(k, m)].append(f(m))
    print(f"{cpu_line()}; {kernel_path()}")
    print(f"heads {h} / KV heads {kvh} x head_dim {d}, block size {bs}, {a.threads} thread(s), {a.rounds} rounds "
          "(medians; a shared machine: noisy)")
    rows = []
    for k, _ in kinds:
        first = statistics.median(samples[(k, names[0])])
        for m in names:
            med = statistics.median(samples[(k, m)])
            keys = a.ctx if k == "decode" else a.prompt
            kv_bytes = caches[m][:, :, 0, 0].numel() * caches[m].element_size() * keys
            rows.append([k, keys, m, kv_bytes // keys, med * 1e3, med / first])
    print(table(rows, ["kernel", "keys", "kv_cache_dtype", "KV bytes/token/layer", "CPU ms/call",
                       f"vs {names[0]}"]))


if __name__ == "__main__":
    main()
