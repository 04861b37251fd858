"""Dense GEMMs of the model's shapes: torch's F.linear (plain weight) beside the weight packed once for
oneDNN (hitenter/models/linear.py), in one run, fp32 and bf16, at decode-to-prefill row counts.

    .venv/bin/python bench/dense_gemm.py [--layers 30] [--rows 1 8 64 512] [--threads 2]

Each row count runs all --layers x (qkv, o_proj, gate_up, down) GEMMs of SmolLM2-135M once per
repeat, so the weights stream from memory as they do in a decode step (a single hot weight would sit in
cache). Prints ms per pass, the weight-read GB/s, the packed/plain speedup, and a JSON line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]   # SmolLM2: fused qkv, o_proj, gate_up, down


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 512])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch
    from torch.nn import functional as F

    from hitenter.models.linear import PACK_ROWS_HINT, packed_matmul

    torch.set_num_threads(a.threads)
    rows, result = [], {}
    for dtype in (torch.float32, torch.bfloat16):
        ws = [torch.randn(n, k).to(dtype) for _ in range(a.layers) for n, k in SHAPES]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT) for w in ws]
        nbytes = sum(w.numel() * w.element_size() for w in ws)
        for m in a.rows:
            xs = {k: torch.randn(m, k).to(dtype) for k in {k for _, k in SHAPES}}

            def timed(fn) -> float:  # type: ignore[no-untyped-def]
                fn()
                t0 = time.perf_counter()
                for _ in range(a.repeats):
                    fn()
                return (time.perf_counter() - t0) / a.repeats

            plain = timed(lambda xs=xs, ws=ws: [F.linear(xs[w.shape[1]], w) for w in ws])
            pk = timed(lambda xs=xs, ws=ws, packed=packed: [packed_matmul(xs[w.shape[1]], p)
                                                           for w, p in zip(ws, packed, strict=True)])
            name = str(dtype).removeprefix("torch.")
            rows.append([name, m, plain * 1e3, pk * 1e3, nbytes / plain / 1e9, nbytes / pk / 1e9, plain / pk])
            result[f"{name}_m{m}"] = {"plain_ms": plain * 1e3, "packed_ms": pk * 1e3, "speedup": plain / pk}
    print(table(rows, ["dtype", "rows", "F.linear ms", "packed ms", "F.linear GB/s", "packed GB/s", "speedup"]))
    emit_json("dense_gemm", result)


if __name__ == "__main__":
    main()
