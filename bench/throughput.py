"""Offline throughput: 64 requests (prompts 16..512, outputs 16..256 tokens, fixed seed) on SmolLM2.

    .venv/bin/python bench/throughput.py [--num 64] [--sequential-sample 16] [--no-hf]
        [--formats fp32 bf16 int4] [--hf-dtypes fp32 bf16]

Three ways in one run: hitenter's engine with all requests at once (continuous batching);
the same requests one at a time in hitenter; HF transformers `generate` with left padding in
batches (fp32, same GGUF). Output tokens/s, ratios, p50/p99 TTFT. The one-at-a-time and HF
baselines can be run on a sample of the requests (`--sequential-sample`, `--hf-sample`) to keep
the run short; their rates are per output token, so a sample measures the same thing.
Each hitenter weight format (fp32: the default; bf16; int4: the GGUF's Q4_1 blocks) runs the same
requests; HF runs in each of --hf-dtypes, so every format has a same-precision baseline.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import FORMATS, emit_json, percentile, table  # noqa: E402


def workload(num: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(100, vocab - 100) for _ in range(rng.randint(16, 512))], rng.randint(16, 256))
            for _ in range(num)]


def run_engine(llm, reqs) -> tuple[float, list[float]]:  # type: ignore[no-untyped-def]
    from hitenter import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in reqs]
    t0 = time.perf_counter()
    outs = llm.generate([p for p, _ in reqs], params)
    dt = time.perf_counter() - t0
    ntok = sum(len(o.token_ids) for o in outs)
    return ntok / dt, [o.metrics.time_to_first_token for o in outs]


HF_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def run_hf(model: str, reqs, batch: int, dtype: str = "fp32") -> float:  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoModelForCausalLM

    from hitenter.models.registry import resolve_model

    path = Path(resolve_model(model))
    m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                             torch_dtype=getattr(torch, HF_DTYPES[dtype])).eval()
    useful, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(reqs), batch):
            chunk = reqs[i:i + batch]
            width = max(len(p) for p, _ in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for j, (p, _) in enumerate(chunk):
                ids[j, width - len(p):] = torch.tensor(p)
                mask[j, width - len(p):] = 1
            new = max(n for _, n in chunk)
            m.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=0)
            useful += sum(n for _, n in chunk)
    return useful / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--num", type=int, default=64)
    ap.add_argument("--sequential-sample", type=int, default=16)
    ap.add_argument("--hf-sample", type=int, default=32)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--formats", nargs="+", default=["fp32", "bf16", "int4"], choices=sorted(FORMATS))
    ap.add_argument("--hf-dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(HF_DTYPES))
    a = ap.parse_args()
    from hitenter import LLM

    rows, result = [], {"num": a.num}
    hf = {d: float("nan") if a.no_hf else 0.0 for d in a.hf_dtypes}
    for fmt in a.formats:
        llm = LLM(a.model, **FORMATS[fmt])
        reqs = workload(a.num, llm.model_config.vocab_size)
        run_engine(llm, workload(4, llm.model_config.vocab_size, seed=99))  # warm up
        batched, ttfts = run_engine(llm, reqs)
        p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
        rows.append([f"hitenter engine [{fmt}] (all at once)", batched, 1.0, p50, p99])
        result[fmt] = {"engine_tok_s": batched, "ttft_p50": p50, "ttft_p99": p99}
        if fmt == a.formats[0]:
            seq_sample = reqs[: a.sequential_sample]
            t0, ntok = time.perf_counter(), 0
            for r in seq_sample:
                run_engine(llm, [r])
                ntok += r[1]
            sequential = ntok / (time.perf_counter() - t0)
            rows.append([f"hitenter [{fmt}] one at a time ({len(seq_sample)} req)", sequential, batched / sequential,
                         float("nan"), float("nan")])
            result["sequential_tok_s"] = sequential
        llm.close()
    for d in hf:
        if not a.no_hf:
            hf[d] = run_hf(a.model, reqs[: a.hf_sample], a.hf_batch, d)
        rows.append([f"HF generate [{d}], padded batches of {a.hf_batch} ({a.hf_sample} req)", hf[d],
                     float("nan"), float("nan"), float("nan")])
    print(table(rows, ["mode", "output tok/s", "vs one at a time", "TTFT p50 s", "TTFT p99 s"]))
    for fmt in a.formats:
        for d, rate in hf.items():
            ratio = result[fmt]["engine_tok_s"] / rate
            result[fmt][f"ratio_vs_hf_{d}"] = ratio
            print(f"engine [{fmt}] / HF [{d}]: {ratio:.2f}x")
    print(f"(all {a.num} requests submitted at t=0; TTFT includes the queue)")
    result["hf_tok_s"] = hf
    emit_json("throughput", result)


if __name__ == "__main__":
    main()
