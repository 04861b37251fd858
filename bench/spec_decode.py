"""Speculative decoding: batch-1 greedy decode with and without it, side by side in one run.

    .venv/bin/python bench/spec_decode.py [--cases qwen-draft qwen-ngram smol-ngram] [--max-tokens 96]
        [--k 4] [--ngram-k 8] [--rounds 3] [--num-threads 2] [--passes]

Cases (each: the target alone, then every speculative configuration, the same prompts):
- qwen-draft: Qwen2.5-Coder-1.5B with the 0.5B as draft model, 4 greedy code prompts (write / edit /
  document / test); configurations: fixed K with the draft's full head (HITENTER_SPEC_ADAPTIVE=0,
  HITENTER_DRAFT_VOCAB=0, HITENTER_DRAFT_LOOKUP=0: the engine before adaptive lengths), adaptive K with
  the trimmed head (the first 32768 ids), the same with prompt lookup first (the default).
- qwen-ngram: Qwen2.5-Coder-1.5B with prompt lookup on a repeat-this-text prompt and a code edit.
- smol-ngram: SmolLM2-135M with prompt lookup on a code-copying prompt.
- hybrid-echo (with ``--echo-gguf``): a synthetic hybrid written by ``bench/synthetic_hybrid.py --echo-cycle``
  (Qwen3.5-2B's shape; greedy decoding continues a token cycle) with prompt lookup on a prompt holding the
  cycle twice: every draft can be accepted, so this measures the speculation mechanics on a hybrid model
  (state scratch slots, rollback, a verification pass over k + 1 rows), not a real model's acceptance.
`--passes`: the cost model's inputs instead: the target's generation pass over R = 1..9 rows of one
request (verifying R - 1 drafts), the draft's step with its trimmed head and with the full head.
Rounds alternate the configurations (all models loaded once); figures are medians over rounds. Every
speculative run must produce the target's tokens ("same"). Decode rate = output tokens after the first /
(last output time - first output time), summed over the prompts; "cpu ms/tok" is the process CPU time
over the same span per token (less sensitive to other load on a shared machine than the wall clock,
though OpenMP's spinning threads count too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line, emit_json, table  # noqa: E402

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
TEXT = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion, "
        "the members agreed to increase funding for the public library by ten percent, to repair the roof "
        "of the community hall before winter, and to postpone the new parking lot until the spring. The "
        "chair thanked the volunteers who had organised the summer festival and asked for ideas for next "
        "year's theme.")
COPY_PROMPT = f"Copy this Python code:\n\n```python\n{CODE}```"
EDIT_PROMPT = f"Rename the variable `total` to `acc` in this code and return all of it:\n\n```python\n{CODE}```"
REPEAT_PROMPT = f"Repeat this text exactly, word for word:\n\n{TEXT}"
CODE_PROMPTS = [
    "Write a Python function `parse_csv_line(line)` that splits one CSV line into fields, handling quoted "
    "fields with commas and doubled quotes. Only the code.",
    EDIT_PROMPT,
    f"Add type hints and a one-line docstring to every function in this code; return the whole code:\n\n"
    f"```python\n{CODE}```",
    "Write a Python function `binary_search(items, target)` returning the index of target in a sorted list "
    "or -1, then three pytest tests for it. Only the code.",
]


KV_BYTES = 256 << 20   # each engine's KV cache (and its draft's): several LLMs stay loaded side by side


def _cached(name: str) -> str | None:
    from hitenter.models.registry import model_path

    p = model_path(name)
    return str(p) if p.exists() else None


HEADER = ["case", "config", "decode tok/s", "speedup", "cpu ms/tok", "cpu speedup", "accept rate",
          "drafted/step", "tokens/step", "tokens", "same"]


def run_prompts(llm: Any, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """One pass over the prompts: tokens, decode seconds (wall and CPU), decode tokens, spec stats."""
    from hitenter import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    tokens, wall, cpu, n, drafted, accepted, steps = [], 0.0, 0.0, 0, 0, 0, 0
    for prompt in prompts:
        marks: list[tuple[float, float]] = []
        mark = lambda o, m=marks: m.append((time.perf_counter(), time.process_time()))  # noqa: E731
        if isinstance(prompt, list):   # token ids
            out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                               on_output=mark)[0]
        else:
            out = llm.chat([{"role": "user", "content": prompt}], sp, on_output=mark)[0]
        toks = out.outputs[0].token_ids
        tokens.append(toks)
        if len(marks) > 1:
            wall += marks[-1][0] - marks[0][0]
            cpu += marks[-1][1] - marks[0][1]
            n += len(toks) - 1   # the tokens after the first output (the prompt step's)
        st = out.extra.get("spec_decode", {})
        drafted += st.get("num_draft_tokens", 0)
        accepted += st.get("num_accepted_tokens", 0)
        steps += st.get("num_verify_steps", 0)
    return {"tokens": tokens, "wall": wall, "cpu": cpu, "n": n, "drafted": drafted, "accepted": accepted,
            "steps": steps}


def build(target: str, opts: dict[str, Any], env: dict[str, str], base: dict[str, Any] | None = None) -> Any:
    """An LLM built with `env` set (the speculative knobs read at construction), restored afterwards."""
    from hitenter import LLM

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return LLM(target, **{"max_model_len": 2048, "kv_cache_memory": KV_BYTES, **(base or {}), **opts})
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bench_case(name: str, target: str, prompts: list[Any], configs: list[tuple[str, dict[str, Any], dict[str, str]]],
               max_tokens: int, rounds: int, base: dict[str, Any] | None = None) -> list[list[Any]]:
    """Target alone + each configuration, alternating rounds after a short warm-up each. A prompt is a
    chat message's text, or a list of token ids (generated from directly, ignoring end tokens)."""
    llms = [("none", build(target, {}, {}, base))] + [(label, build(target, o, e, base)) for label, o, e in configs]
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in llms}
    for _, llm in llms:
        run_prompts(llm, prompts[:1], 8)   # warm-up
    for _ in range(rounds):
        for label, llm in llms:
            results[label].append(run_prompts(llm, prompts, max_tokens))
    base = results["none"]
    base_tokens = base[0]["tokens"]
    base_rate = statistics.median(x["n"] / x["wall"] for x in base)
    base_cpu = statistics.median(x["cpu"] / x["n"] for x in base)
    rows = []
    for label, _ in llms:
        xs = results[label]
        rate = statistics.median(x["n"] / x["wall"] for x in xs)
        cpu = statistics.median(x["cpu"] / x["n"] for x in xs)
        last = xs[-1]
        same = all(x["tokens"] == base_tokens for x in xs)
        acc = last["accepted"] / last["drafted"] if last["drafted"] else 0.0
        per_step = (last["accepted"] + last["steps"]) / last["steps"] if last["steps"] else 1.0
        rows.append([name, label, rate, rate / base_rate, 1e3 * cpu, base_cpu / cpu if cpu else 0.0,
                     acc, last["drafted"] / last["steps"] if last["steps"] else 0.0, per_step,
                     sum(len(t) for t in last["tokens"]), "-" if label == "none" else ("yes" if same else "NO")])
    del llms
    print(table(rows, HEADER), flush=True)
    return rows


def pass_costs(name: str, runner: Any, kv: Any, rows: list[int], rounds: int, context: int = 300) -> list[list[Any]]:
    """Seconds of one generation pass over R rows of one request (its verification of R - 1 drafts), by R:
    a `context`-token prompt computed once, then passes writing the same positions again, rounds alternating."""
    from hitenter import SamplingParams
    from hitenter.engine.scheduler import ScheduledRequest, SchedulerOutput
    from hitenter.request import Request, RequestStatus

    req = Request("passes", [1000 + i % 5000 for i in range(context)], SamplingParams(temperature=0.0), 64,
                  frozenset(), status=RequestStatus.RUNNING)
    kv.allocate_slots(req, context)
    runner.execute(SchedulerOutput(0, [ScheduledRequest(req, context, 0, kv.block_table(req.request_id))], [], context))
    req.num_computed_tokens = context
    req.output_token_ids.extend([2000 + i for i in range(max(rows))])
    kv.allocate_slots(req, max(rows))
    table_ = kv.block_table(req.request_id)
    wall: dict[int, list[float]] = {r: [] for r in rows}
    cpu: dict[int, list[float]] = {r: [] for r in rows}
    for _ in range(rounds + 1):
        for r in rows:
            req.output_token_ids[r:] = []
            req.output_token_ids.extend([2000 + i for i in range(r, max(rows))])
            out = SchedulerOutput(0, [ScheduledRequest(req, r, context, table_)], [], r)
            c0, w0 = time.process_time(), time.perf_counter()
            runner.execute(out)
            wall[r].append(time.perf_counter() - w0)
            cpu[r].append(time.process_time() - c0)
    kv.free(req)
    w1, c1 = statistics.median(wall[rows[0]][1:]), statistics.median(cpu[rows[0]][1:])
    return [[name, r, 1e3 * statistics.median(wall[r][1:]), statistics.median(wall[r][1:]) / w1,
             1e3 * statistics.median(cpu[r][1:]), statistics.median(cpu[r][1:]) / c1] for r in rows]


def passes(target: str, draft: str | None, rounds: int) -> int:
    """The cost model's inputs: the target's pass by rows, the draft's one-row step (its trimmed head)."""
    llm = build(target, {"speculative_model": draft, "num_speculative_tokens": 4} if draft else {}, {})
    eng = llm.engine
    rows = pass_costs(Path(target).stem, eng.runner, eng.kv_manager, list(range(1, 10)), rounds)
    if draft:
        p = eng.spec.proposer
        rows += pass_costs(Path(draft).stem + " (draft head)", p.runner, p.kv, [1, 2], rounds)
        full = build(draft, {}, {})
        rows += pass_costs(Path(draft).stem + " (full head)", full.engine.runner, full.engine.kv_manager, [1], rounds)
    t1 = rows[0][2]
    for r in rows:
        r.append(r[2] / t1)
    print(cpu_line())
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
    header = ["model", "rows", "wall ms", "vs 1 row", "cpu ms", "cpu vs 1 row", "wall vs target 1 row"]
    print(table(rows, header))
    if draft:   # the cost model: a step drafting k emits E(k) tokens for k draft steps + a (k + 1)-row pass
        from hitenter.engine.speculative.adaptive import expected_tokens

        for col, what in ((2, "wall"), (4, "cpu")):
            t1 = rows[0][col]
            v = {r[1]: r[col] / t1 for r in rows if r[0] == Path(target).stem}
            c = next(r[col] for r in rows if r[0].endswith("(draft head)") and r[1] == 1) / t1
            for alpha in (0.6, 0.7, 0.8, 0.9):
                for name, cost in (("draft model", c), ("prompt lookup", 0.0)):
                    best = max(range(1, 9), key=lambda k, cost=cost, alpha=alpha, v=v:
                               expected_tokens(alpha, k) / (k * cost + v[k + 1]))
                    sp = expected_tokens(alpha, best) / (best * cost + v[best + 1])
                    print(f"{what} alpha {alpha:.1f} {name:13s}: best k {best}, predicted speedup {sp:.2f}x "
                          f"(t_draft/t_target {cost:.2f}, t_verify({best + 1} rows)/t_target {v[best + 1]:.2f})")
    emit_json("spec_decode_passes", {"cpu": cpu_line(), "rows": [dict(zip(header, r, strict=True)) for r in rows]})
    return 0


def _echo_prompt(path: Path) -> list[int]:
    """The echo file's token cycle twice, then its first few tokens: the model continues the cycle."""
    import gguf
    from synthetic_hybrid import ECHO_KEY

    field = gguf.GGUFReader(str(path)).fields.get(ECHO_KEY)
    if field is None:
        raise SystemExit(f"{path} has no {ECHO_KEY}: write it with bench/synthetic_hybrid.py --echo-cycle L")
    cycle = [int(t) for t in field.contents()]
    return cycle * 2 + cycle[:4]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=["qwen-draft", "qwen-ngram", "smol-ngram", "hybrid-echo"],
                    choices=["qwen-draft", "qwen-ngram", "smol-ngram", "hybrid-echo"])
    ap.add_argument("--echo-gguf", type=Path, help="a file from bench/synthetic_hybrid.py --echo-cycle (hybrid-echo)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens (the adaptive length's maximum)")
    ap.add_argument("--ngram-k", type=int, default=8, help="num_speculative_tokens for prompt lookup")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--passes", action="store_true", help="only the cost model's pass times (target by rows, draft)")
    a = ap.parse_args()
    if a.num_threads:
        import torch

        torch.set_num_threads(a.num_threads)
    if a.passes:
        q05, q15 = _cached("qwen2.5-coder-0.5b-instruct"), _cached("qwen2.5-coder-1.5b-instruct")
        if not q15:
            print("(Qwen2.5-Coder-1.5B not cached)")
            return 1
        return passes(q15, q05, a.rounds)
    q05, q15, smol = (_cached(m) for m in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct",
                                            "smollm2-135m-instruct"))
    fixed, adaptive = {"HITENTER_SPEC_ADAPTIVE": "0"}, {"HITENTER_SPEC_ADAPTIVE": "1"}
    ngram = {"speculative_method": "ngram", "num_speculative_tokens": a.ngram_k}
    rows: list[list[Any]] = []
    if "qwen-draft" in a.cases and q05 and q15:
        draft = {"speculative_model": q05, "num_speculative_tokens": a.k}
        old = {"HITENTER_SPEC_ADAPTIVE": "0", "HITENTER_DRAFT_VOCAB": "0", "HITENTER_DRAFT_LOOKUP": "0"}
        rows += bench_case("qwen1.5b+0.5b code", q15, CODE_PROMPTS,
                           [(f"draft K={a.k} full head", draft, old),
                            ("draft adaptive", draft, {**adaptive, "HITENTER_DRAFT_LOOKUP": "0"}),
                            ("draft adaptive+lookup", draft, adaptive)],
                           a.max_tokens, a.rounds)
    if "qwen-ngram" in a.cases and q15:
        for case, prompt in (("qwen1.5b repeat", REPEAT_PROMPT), ("qwen1.5b edit", EDIT_PROMPT)):
            rows += bench_case(case, q15, [prompt], [(f"ngram K={a.ngram_k}", ngram, fixed),
                                                     ("ngram adaptive", ngram, adaptive)], a.max_tokens, a.rounds)
    if "smol-ngram" in a.cases and smol:
        rows += bench_case("smollm2 copy", smol, [COPY_PROMPT], [(f"ngram K={a.ngram_k}", ngram, fixed),
                                                                 ("ngram adaptive", ngram, adaptive)],
                           a.max_tokens, a.rounds)
    if "hybrid-echo" in a.cases and a.echo_gguf:
        rows += bench_case("hybrid echo", str(a.echo_gguf), [_echo_prompt(a.echo_gguf)],
                           [(f"ngram K={a.ngram_k}", ngram, fixed), ("ngram adaptive", ngram, adaptive)],
                           a.max_tokens, a.rounds, base={"max_num_seqs": 2, "kv_cache_memory": 1 << 30})
    if not rows:
        print("(no case ran: the models are not cached; `hitenter pull qwen2.5-coder-1.5b-instruct`)")
        return 1
    header = HEADER
    print(cpu_line())
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
    print(table(rows, header))
    emit_json("spec_decode", {"cpu": cpu_line(), "rows": [dict(zip(header, r, strict=True)) for r in rows]})
    return 0 if all(r[-1] in ("yes", "-") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
