"""Speculative decoding: batch-1 greedy decode tokens/s with and without it, acceptance, in one run.

    .venv/bin/python bench/spec_decode.py [--max-tokens 128] [--k 2 4] [--repeats 2] [--qwen-ngram]

Cases: SmolLM2-135M with prompt lookup (ngram) on a code-copying chat prompt; Qwen2.5-Coder-1.5B with
the 0.5B as draft model when both GGUFs are cached (`hitenter pull qwen2.5-coder-1.5b-instruct`);
`--qwen-ngram` adds Qwen2.5-Coder-0.5B with prompt lookup. Every speculative run is checked to produce
the same tokens as the plain run. Decode rate = (tokens - 1) / (last output time - first output time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402

CODE = '''def checksum(data):
    total = 0
    for i, byte in enumerate(data):
        total = (total * 31 + byte + i) % 65521
    return total


def find_block(blocks, key):
    """Return the index of the first block whose key matches, or -1."""
    for i, block in enumerate(blocks):
        if block.key == key:
            return i
    return -1
'''
COPY_PROMPT = f"Copy this Python code:\n\n```python\n{CODE}```"
EDIT_PROMPT = f"Rename the variable `total` to `acc` in this code and return all of it:\n\n```python\n{CODE}```"


def _cached(name: str) -> str | None:
    from hitenter.models.registry import model_path

    p = model_path(name)
    return str(p) if p.exists() else None


def decode_run(llm: Any, prompt: str, max_tokens: int, repeats: int) -> tuple[float, list[int], dict[str, float]]:
    """Best decode tokens/s over `repeats` runs (after a warm-up), the tokens, and the spec stats of a run."""
    from hitenter import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    msgs = [{"role": "user", "content": prompt}]
    best, tokens, extra = 0.0, [], {}
    for r in range(repeats + 1):
        times: list[float] = []
        out = llm.chat(msgs, sp, on_output=lambda o, t=times: t.append(time.perf_counter()))[0]
        tokens = out.outputs[0].token_ids
        extra = out.extra.get("spec_decode", {})
        if r and len(tokens) > 1 and times[-1] > times[0]:
            best = max(best, (len(tokens) - 1) / (times[-1] - times[0]))
    return best, tokens, extra


def bench_case(name: str, target: str, prompt: str, specs: list[dict[str, Any]], max_tokens: int,
               repeats: int) -> list[list[Any]]:
    from hitenter import LLM

    plain = LLM(target, max_model_len=2048)
    base_rate, base_tokens, _ = decode_run(plain, prompt, max_tokens, repeats)
    del plain
    rows: list[list[Any]] = [[name, "none", "-", base_rate, 1.0, "-", "-", len(base_tokens), "-"]]
    for opts in specs:
        llm = LLM(target, max_model_len=2048, **opts)
        rate, tokens, st = decode_run(llm, prompt, max_tokens, repeats)
        how = "ngram" if opts.get("speculative_method") == "ngram" else Path(opts["speculative_model"]).stem
        rows.append([name, how, opts["num_speculative_tokens"], rate, rate / base_rate if base_rate else 0.0,
                     st.get("acceptance_rate", 0.0), st.get("mean_accepted_length", 0.0), len(tokens),
                     "yes" if tokens == base_tokens else "NO"])
        del llm
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--qwen-ngram", action="store_true", help="also Qwen2.5-Coder-0.5B with prompt lookup")
    a = ap.parse_args()
    if a.num_threads:
        import torch

        torch.set_num_threads(a.num_threads)
    from hitenter.models.registry import resolve_model

    rows: list[list[Any]] = []
    smol = str(resolve_model("smollm2-135m-instruct"))
    rows += bench_case("smollm2-135m copy", smol, COPY_PROMPT,
                       [{"speculative_method": "ngram", "num_speculative_tokens": k} for k in a.k], a.max_tokens, a.repeats)
    q05, q15 = _cached("qwen2.5-coder-0.5b-instruct"), _cached("qwen2.5-coder-1.5b-instruct")
    if a.qwen_ngram and q05:
        rows += bench_case("qwen-coder-0.5b edit", q05, EDIT_PROMPT,
                           [{"speculative_method": "ngram", "num_speculative_tokens": k} for k in a.k],
                           a.max_tokens, a.repeats)
    if q05 and q15:
        rows += bench_case("qwen-coder-1.5b edit", q15, EDIT_PROMPT,
                           [{"speculative_model": q05, "num_speculative_tokens": k} for k in a.k]
                           + [{"speculative_method": "ngram", "num_speculative_tokens": a.k[-1]}],
                           a.max_tokens, a.repeats)
    else:
        print("(Qwen2.5-Coder 1.5B/0.5B pair not cached: skipped; `hitenter pull qwen2.5-coder-1.5b-instruct`)")
    header = ["case", "proposer", "K", "decode tok/s", "speedup", "accept rate", "accepted/step", "tokens", "same"]
    print(table(rows, header))
    emit_json("spec_decode", {"rows": [dict(zip(header, r, strict=True)) for r in rows]})
    return 0 if all(r[-1] in ("yes", "-") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
