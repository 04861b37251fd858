"""Offline throughput: 64 requests (prompts 16..512, outputs 16..256 tokens, fixed seed) on SmolLM2.

    .venv/bin/python bench/throughput.py [--num 64] [--sequential-sample 16] [--no-hf]
        [--formats gguf fp32 bf16 int4] [--hf-dtypes fp32 bf16] [--rounds 3]

Three ways in one run: hitenter's engine with all requests at once (continuous batching);
the same requests one at a time in hitenter; HF transformers `generate` with left padding in
batches (fp32, same GGUF). Output tokens/s, ratios, p50/p99 TTFT. The one-at-a-time and HF
baselines can be run on a sample of the requests (`--sequential-sample`, `--hf-sample`) to keep
the run short; their rates are per output token, so a sample measures the same thing.
Each hitenter weight format (gguf: the default, the file's own blocks; fp32: dequantized; bf16; int4:
torch's int4 kernel on the Q4_1 blocks) runs the same
requests; HF runs in each of --hf-dtypes, so every format has a same-precision baseline.
"""

from __future__ import annotations

import argparse
import random
import statistics
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


def engine_round(model: str, fmt: str, num: int, sequential_sample: int) -> tuple[dict[str, float], list]:
    """One fresh engine (cold prefix cache) on the workload: output tok/s, TTFT p50/p99, and with
    sequential_sample > 0 the same engine one request at a time on that many requests; and the requests."""
    from hitenter import LLM

    llm = LLM(model, **FORMATS[fmt])
    reqs = workload(num, llm.model_config.vocab_size)
    run_engine(llm, workload(4, llm.model_config.vocab_size, seed=99))  # warm up (other prompts: no cache hits)
    rate, ttfts = run_engine(llm, reqs)
    out = {"engine_tok_s": rate, "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99)}
    if sequential_sample:
        t0, ntok = time.perf_counter(), 0
        for r in reqs[:sequential_sample]:
            run_engine(llm, [r])
            ntok += r[1]
        out["sequential_tok_s"] = ntok / (time.perf_counter() - t0)
    llm.close()
    return out, reqs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--num", type=int, default=64)
    ap.add_argument("--sequential-sample", type=int, default=16)
    ap.add_argument("--hf-sample", type=int, default=32)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--formats", nargs="+", default=["gguf", "fp32", "bf16", "int4"], choices=sorted(FORMATS))
    ap.add_argument("--hf-dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(HF_DTYPES))
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat engine and HF runs alternately; each ratio is taken within a round and the "
                         "median over rounds reported (this box's speed drifts 20%% over minutes)")
    a = ap.parse_args()
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(a.rounds):
        res: dict[str, dict[str, float]] = {}
        for fmt in a.formats:   # every format runs the same requests (the model's vocabulary fixes them)
            res[fmt], reqs = engine_round(a.model, fmt, a.num,
                                          a.sequential_sample if r == 0 and fmt == a.formats[0] else 0)
        if not a.no_hf:   # HF on a sample of those same requests
            res["hf"] = {d: run_hf(a.model, reqs[: a.hf_sample], a.hf_batch, d) for d in a.hf_dtypes}
        rounds.append(res)
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {v['engine_tok_s']:.1f}" for k, v in res.items()
                                                      if k != "hf")
              + ("" if a.no_hf else ", " + ", ".join(f"HF {d} {v:.1f}" for d, v in res["hf"].items())), flush=True)
    med = statistics.median
    rows, result = [], {"num": a.num, "rounds": rounds}
    for fmt in a.formats:
        vals = {k: med(rd[fmt][k] for rd in rounds) for k in ("engine_tok_s", "ttft_p50", "ttft_p99")}
        rows.append([f"hitenter engine [{fmt}] (all at once)", vals["engine_tok_s"], 1.0, vals["ttft_p50"],
                     vals["ttft_p99"]])
        result[fmt] = vals
        if "sequential_tok_s" in rounds[0][fmt]:
            seq = rounds[0][fmt]["sequential_tok_s"]
            rows.append([f"hitenter [{fmt}] one at a time ({a.sequential_sample} req, round 1)", seq,
                         rounds[0][fmt]["engine_tok_s"] / seq, float("nan"), float("nan")])
            result["sequential_tok_s"] = seq
    for d in a.hf_dtypes:
        rate = float("nan") if a.no_hf else med(rd["hf"][d] for rd in rounds)
        rows.append([f"HF generate [{d}], padded batches of {a.hf_batch} ({a.hf_sample} req)", rate,
                     float("nan"), float("nan"), float("nan")])
    print(table(rows, ["mode", f"output tok/s (median of {a.rounds})", "vs one at a time", "TTFT p50 s",
                       "TTFT p99 s"]))
    if not a.no_hf:
        for fmt in a.formats:
            for d in a.hf_dtypes:
                per_round = [rd[fmt]["engine_tok_s"] / rd["hf"][d] for rd in rounds]
                result[fmt][f"ratio_vs_hf_{d}"] = med(per_round)
                print(f"engine [{fmt}] / HF [{d}]: {med(per_round):.2f}x (median; rounds: "
                      + ", ".join(f"{x:.2f}" for x in per_round) + ")")
    print(f"(all {a.num} requests submitted at t=0; TTFT includes the queue)")
    emit_json("throughput", result)


if __name__ == "__main__":
    main()
