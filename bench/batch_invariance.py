"""The cost of bitwise batch invariance: the same engine with `batch_invariant` on and off, in one run.

    .venv/bin/python bench/batch_invariance.py [--model smollm2-135m-instruct] [--repeats 3]

Measures decode tokens/s at batch 1 and output tokens/s for 16 concurrent requests, alternating
the two settings on one loaded model so that machine noise hits both alike; prints the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    from hitenter import LLM, SamplingParams

    llm = LLM(a.model, enable_prefix_caching=False)
    net = llm.engine.parts.model

    def decode_b1() -> float:
        times: list[float] = []
        llm.generate([list(range(100, 116))], SamplingParams(temperature=0, max_tokens=a.decode, ignore_eos=True),
                     on_output=lambda o: times.append(time.perf_counter()))
        return (len(times) - 1) / (times[-1] - times[0])

    def batched() -> float:
        prompts = [list(range(100 + i, 164 + i)) for i in range(a.batch)]
        t0 = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=a.decode, ignore_eos=True))
        return a.batch * a.decode / (time.perf_counter() - t0)

    res: dict[bool, dict[str, list[float]]] = {True: {"b1": [], "bn": []}, False: {"b1": [], "bn": []}}
    for r in range(a.repeats + 1):
        for bi in (True, False):
            net.batch_invariant = bi
            d, b = decode_b1(), batched()
            if r:  # the first round warms up
                res[bi]["b1"].append(d)
                res[bi]["bn"].append(b)
    med = {bi: {k: statistics.median(v) for k, v in m.items()} for bi, m in res.items()}
    rows = [["batch_invariant=True", med[True]["b1"], med[True]["bn"]],
            ["batch_invariant=False", med[False]["b1"], med[False]["bn"]],
            ["cost (1 - on/off)", 1 - med[True]["b1"] / med[False]["b1"], 1 - med[True]["bn"] / med[False]["bn"]]]
    print(table(rows, ["mode", "decode b1 tok/s", f"{a.batch} requests tok/s"]))
    emit_json("batch_invariance", {"on": med[True], "off": med[False],
                                   "cost_b1": 1 - med[True]["b1"] / med[False]["b1"],
                                   "cost_batched": 1 - med[True]["bn"] / med[False]["bn"]})


if __name__ == "__main__":
    main()
