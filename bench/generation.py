"""Decode tokens/s at batch 1 and prefill tokens/s, hitenter beside HF transformers, in one run.

    .venv/bin/python bench/generation.py [--model smollm2-135m-instruct] [--decode 128] [--prefill 512]

HF transformers (fp32, loading the same GGUF) is the baseline; install it with
`.venv/bin/pip install -e .[golden]`. Ratios are what to read: the machine is noisy.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402


def hitenter_rates(model: str, n_prefill: int, n_decode: int, repeats: int) -> tuple[float, float]:
    from hitenter import LLM, SamplingParams

    llm = LLM(model, enable_prefix_caching=False, max_num_batched_tokens=max(2048, n_prefill))
    rng = random.Random(0)
    vocab = llm.model_config.vocab_size
    best_p, best_d = 0.0, 0.0
    for r in range(repeats + 1):  # first run warms up
        prompt = [rng.randrange(100, vocab - 100) for _ in range(n_prefill)]
        t0 = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
        p_rate = n_prefill / (time.perf_counter() - t0)
        times: list[float] = []
        llm.generate([prompt[:16]], SamplingParams(temperature=0, max_tokens=n_decode, ignore_eos=True),
                     on_output=lambda o, t=times: t.append(time.perf_counter()))
        d_rate = (len(times) - 1) / (times[-1] - times[0])
        if r:
            best_p, best_d = max(best_p, p_rate), max(best_d, d_rate)
    return best_p, best_d


def hf_rates(model: str, n_prefill: int, n_decode: int, repeats: int) -> tuple[float, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from hitenter.models.registry import resolve_model

    path = Path(resolve_model(model))
    m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32).eval()
    vocab = m.config.vocab_size
    rng = random.Random(0)
    best_p, best_d = 0.0, 0.0
    with torch.inference_mode():
        for r in range(repeats + 1):
            ids = torch.tensor([[rng.randrange(100, vocab - 100) for _ in range(n_prefill)]])
            t0 = time.perf_counter()
            m(ids)
            p_rate = n_prefill / (time.perf_counter() - t0)
            short = ids[:, :16]
            t0 = time.perf_counter()
            m.generate(short, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            t1 = time.perf_counter()
            m.generate(short, max_new_tokens=n_decode, min_new_tokens=n_decode, do_sample=False)
            t2 = time.perf_counter()
            d_rate = (n_decode - 1) / ((t2 - t1) - (t1 - t0))
            if r:
                best_p, best_d = max(best_p, p_rate), max(best_d, d_rate)
    return best_p, best_d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true")
    a = ap.parse_args()
    hp, hd = hitenter_rates(a.model, a.prefill, a.decode, a.repeats)
    fp, fd = (float("nan"), float("nan")) if a.no_hf else hf_rates(a.model, a.prefill, a.decode, a.repeats)
    rows = [["hitenter", hp, hd], ["hf transformers fp32", fp, fd], ["ratio", hp / fp, hd / fd]]
    print(table(rows, ["engine", f"prefill {a.prefill} tok/s", f"decode b1 {a.decode} tok/s"]))
    emit_json("generation", {"model": a.model, "hitenter_prefill": hp, "hitenter_decode": hd,
                             "hf_prefill": fp, "hf_decode": fd, "prefill_ratio": hp / fp, "decode_ratio": hd / fd})


if __name__ == "__main__":
    main()
