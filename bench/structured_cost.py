"""Per-token cost of a grammar-constrained row (structured outputs), and of a constrained neighbour
on unconstrained rows.

    python bench/structured_cost.py [--model smollm2-135m-instruct] [--tokens 48] [--rounds 3] [--cpu]

Reports the median inter-token latency (decode steps only) at batch 1, unconstrained vs. a JSON
schema whose strings never end (so both run exactly --tokens tokens), interleaved round by round,
then batch 8 with 0 vs. 1 constrained rows (the unconstrained rows' latency). Also the mask's own
cost: GrammarMask over one row of the model's vocabulary. ``--cpu``: process CPU time per decode step
instead of wall-clock latency; with ``--threads 1`` it counts work, not waiting, so it holds when other
work shares the cores (``--cpu --threads 1``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hitenter.engine.structured import backend_for
from hitenter.llm import LLM
from hitenter.sampling_params import SamplingParams, StructuredSpec

SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
          "required": ["notes"], "additionalProperties": False}


PROMPT = "Write notes about the sea:"


def itl(llm: LLM, params: list[SamplingParams], cpu: bool = False) -> list[float]:
    """Per request its median inter-token latency; ``cpu``: the median process CPU time of a decode step
    (for every row alike; holds better than wall time on a box shared with other work)."""
    if not cpu:
        outs = llm.generate([PROMPT] * len(params), params)
        return [statistics.median(o.metrics.inter_token_latencies) for o in outs if o.metrics]
    eng = llm.engine
    for p in params:
        eng.add_request(None, PROMPT, p)
    steps = []
    while eng.has_unfinished_requests():
        t0 = time.process_time()
        eng.step()
        steps.append(time.process_time() - t0)
    return [statistics.median(steps[1:])] * len(params)    # the first step is the prefill


def mask_cost(llm: LLM, n: int = 64) -> float:
    eng = llm.engine
    cons = backend_for(eng.tokenizer, eng.model_config.vocab_size).constraint(StructuredSpec("json_schema", json.dumps(SCHEMA)))
    from hitenter.engine.logits_processors import BatchState
    from hitenter.engine.structured import GrammarMask

    mask, v = GrammarMask(), eng.model_config.vocab_size
    ts = []
    for tok in eng.tokenizer.encode('{"notes": ["the sea is', add_bos=False)[:n]:
        logits = torch.randn(1, v)
        batch = BatchState([SamplingParams()], [()], [()], [frozenset()], [cons])
        t0 = time.perf_counter()
        mask(logits, batch)
        ts.append(time.perf_counter() - t0)
        cons.accept(tok)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="process CPU time per decode step instead of wall ITL")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 with --cpu: no spin-waiting)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    llm = LLM(a.model, max_model_len=512, num_threads=a.threads)
    print(f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    g = StructuredSpec("json_schema", json.dumps(SCHEMA))
    plain = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    guided = plain.replace(structured=g)
    itl(llm, [plain])                                   # warm up (and build the grammar backend)
    itl(llm, [guided])
    print(f"warm after {time.perf_counter() - t0:.1f} s", flush=True)
    b1p, b1g, b8p, b8g = [], [], [], []
    for _ in range(a.rounds):
        b1p += itl(llm, [plain], a.cpu)
        b1g += itl(llm, [guided], a.cpu)
        b8p += itl(llm, [plain] * 8, a.cpu)
        b8g += itl(llm, [guided] + [plain] * 7, a.cpu)[1:]     # the unconstrained rows next to a constrained one
        print(f"round: b1 {b1p[-1] * 1e3:.2f} / {b1g[-1] * 1e3:.2f} ms, b8 {b8p[-1] * 1e3:.2f} / {b8g[-1] * 1e3:.2f} ms",
              flush=True)
    p, q = statistics.median(b1p), statistics.median(b1g)
    print(f"mask (fill + apply), one row, V={llm.engine.model_config.vocab_size}: {mask_cost(llm) * 1e3:.3f} ms")
    print(f"batch 1: unconstrained {p * 1e3:.2f} ms/token, constrained {q * 1e3:.2f} ms/token ({(q / p - 1) * 100:+.1f}%)")
    p8, q8 = statistics.median(b8p), statistics.median(b8g)
    print(f"batch 8: unconstrained rows {p8 * 1e3:.2f} ms/token alone, {q8 * 1e3:.2f} ms/token next to a "
          f"constrained row ({(q8 / p8 - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
