"""Where a speculative step's time goes: the target's R-row verification pass against its one-row decode pass,
split by part, and the speculative step's own overhead. CPU time (process_time), minima of many repeats
(the machine may be shared: a minimum is the least disturbed run).

    .venv/bin/python bench/spec_verify_profile.py [--rows 5] [--repeats 40] [--threads 1] [--context 300]
        [--parts pass matmul step] [--loop R --seconds S]

- pass: one target generation pass (runner.execute: embedding, the fused layers, the head, Python) over 1, 2,
  .., R rows of one request at `context` tokens, alternating; each in one-row passes.
- matmul: every weight the pass multiplies (each layer's projections, the output head), qmatmul at M = 1 and
  M = R on random activations, grouped by role and block type (e.g. "ffn_down Q6_K", "head Q6_K"): ms per
  pass at 1 and R rows, and each group's extra cost in one-row passes; "rest" = pass - matmuls (attention,
  norms / RoPE / cache writes, the embedding, Python). The groups take repeats / 4 rounds, so on a loaded machine
  their minima stay above the pass's share and "rest" comes out negative: read the ratios, and `--loop` under
  perf for the rest (a 5-row pass measured so: the matmul kernels ~92% of samples, decode attention ~3.5%,
  the fused layer's glue ~1%, Python / torch dispatch well under 1%).
- step: a real greedy speculative generation (the qwen-draft case of bench/spec_decode.py: 1.5B target, 0.5B
  draft, K = `--k`, adaptive off), each engine step's CPU time split into the draft's proposal, the target's
  pass, verification (spec.sample) and the rest of the step (scheduling, outputs, bookkeeping), in one-row
  target passes per step.
- `--loop R --seconds S`: only run R-row passes for S seconds (for `perf record -F 999 -g -- python ...`:
  attention / glue / Python by symbol; the summary prints passes run, to divide sample counts by).
Threads: `--threads 1` (default) makes CPU time the work itself (OpenMP's spinning threads count as CPU time
at 2); the engine's own rate runs at 2 threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line, emit_json, table  # noqa: E402


def _cached(name: str) -> str:
    from hitenter.models.registry import model_path

    p = model_path(name)
    if not p.exists():
        raise SystemExit(f"({name} not cached: `hitenter pull {name}`)")
    return str(p)


CLOCK = time.process_time   # --clock wall: time.perf_counter


def alternating_min(fns: dict[Any, Callable[[], Any]], repeats: int) -> dict[Any, float]:
    """Least CPU seconds of each fn, calls alternating (one round = each fn once) so load hits all alike."""
    best = {k: float("inf") for k in fns}
    for f in fns.values():
        f()
    for _ in range(repeats):
        for k, f in fns.items():
            c0 = CLOCK()
            f()
            best[k] = min(best[k], CLOCK() - c0)
    return best


class PassRig:
    """A request at `context` tokens in the target's cache and a function running one generation pass over
    R of its rows (writing the same positions again each time)."""

    def __init__(self, runner: Any, kv: Any, context: int, max_rows: int) -> None:
        from hitenter import SamplingParams
        from hitenter.engine.scheduler import ScheduledRequest, SchedulerOutput
        from hitenter.request import Request, RequestStatus

        self.runner, self.kv, self.context = runner, kv, context
        self._sr, self._so = ScheduledRequest, SchedulerOutput
        req = Request("verify-profile", [1000 + i % 5000 for i in range(context)], SamplingParams(temperature=0.0),
                      64, frozenset(), status=RequestStatus.RUNNING)
        kv.allocate_slots(req, context)
        runner.execute(SchedulerOutput(0, [ScheduledRequest(req, context, 0, kv.block_table(req.request_id))], [],
                                       context))
        req.num_computed_tokens = context
        req.output_token_ids.extend([2000 + i for i in range(max_rows)])
        kv.allocate_slots(req, max_rows)
        self.req, self.table = req, kv.block_table(req.request_id)

    def run(self, rows: int) -> Any:
        """One pass over `rows` rows: the newest token + rows - 1 drafts, as the verifier schedules them."""
        req = self.req
        del req.output_token_ids[1:]
        req.output_token_ids.extend([2000 + i for i in range(1, rows)])
        req.spec_token_ids = [2000 + i for i in range(1, rows)]
        req.num_computed_tokens = self.context
        out = self.runner.execute(self._so(0, [self._sr(req, rows, self.context, self.table)], [], rows))
        req.spec_token_ids = []
        return out

    def close(self) -> None:
        self.kv.free(self.req)


def weight_groups(model: Any) -> dict[str, list[Any]]:
    """The model's BlockWeights by role and type: "<role> <type>" -> weights (each once a pass)."""
    from hitenter.kernels.blocks import BlockWeight

    groups: dict[str, list[Any]] = defaultdict(list)
    for name, mod in model.named_modules():
        parts = getattr(mod, "parts", None)
        if not parts:
            continue
        role = "head" if name.split(".")[-1] in ("head", "lm_head", "output") else name.split(".")[-1]
        for i, w in enumerate(parts):
            if isinstance(w, BlockWeight):
                sub = role if len(parts) == 1 else f"{role}[{i}]"
                groups[f"{sub} {w.type_name}"].append(w)
    return dict(groups)


def matmul_parts(model: Any, rows: int, repeats: int, t1_pass: float) -> list[list[Any]]:
    """ms per pass of each weight group at 1 and `rows` rows (qmatmul, the fused layer's kernel), min CPU."""
    import torch

    from hitenter.kernels.qmatmul import qmatmul

    out = []
    for key, ws in sorted(weight_groups(model).items()):
        k = ws[0].shape[1]
        x1, xr = torch.randn(1, k), torch.randn(rows, k)
        # every weight of the group once per timed call (one pass's worth), alternating 1 and R rows
        def calls(x: Any, ws: list[Any] = ws) -> Callable[[], Any]:
            return lambda: [qmatmul(x, w) for w in ws]
        t = alternating_min({1: calls(x1), rows: calls(xr)}, repeats)
        out.append([key, len(ws), f"{ws[0].shape[0]}x{k}", 1e3 * t[1], 1e3 * t[rows], t[rows] / t[1],
                    (t[rows] - t[1]) / t1_pass])
    return out


def pass_part(eng: Any, rows: int, repeats: int, context: int) -> dict[int, float]:
    """Least seconds of a target pass over 1 .. `rows` rows (alternating)."""
    rig = PassRig(eng.runner, eng.kv_manager, context, rows)
    t = alternating_min({r: lambda r=r: rig.run(r) for r in range(1, rows + 1)}, repeats)
    rig.close()
    return t


def step_part(llm: Any, prompt: str, max_tokens: int, t1_pass: float) -> list[list[Any]]:
    """One greedy speculative generation, each step's CPU time split by part (wrapped methods)."""
    from hitenter import SamplingParams

    eng = llm.engine
    spent: dict[str, float] = defaultdict(float)
    mins: dict[str, list[float]] = defaultdict(list)

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            c0 = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] += time.process_time() - c0
        return wrapper

    proposer, spec = eng.spec.proposer, eng.spec
    orig = (proposer.propose, eng.runner.execute, spec.sample, eng.step)
    draft_exec = proposer.runner.execute
    proposer.propose = timed("draft: propose (its steps + sync)", orig[0])
    proposer.runner.execute = timed("draft: model passes", draft_exec)
    eng.runner.execute = timed("target: pass", orig[1])
    spec.sample = timed("verify: spec.sample (chain, accept)", orig[2])
    steps = {"n": 0, "spec": 0}

    def step() -> Any:
        before = dict(spent)
        c0 = time.process_time()
        res = orig[3]()
        total = time.process_time() - c0
        d = {k: spent[k] - before.get(k, 0.0) for k in spent}
        if d.get("verify: spec.sample (chain, accept)", 0.0) > 0:   # a speculative step (drafts verified)
            steps["spec"] += 1
            for k, v in d.items():
                mins[k].append(v)
            inner = sum(v for k, v in d.items() if k != "draft: model passes")
            mins["rest of engine.step"].append(total - inner)
            mins["whole step"].append(total)
        steps["n"] += 1
        return res

    eng.step = step
    try:
        out = llm.chat([{"role": "user", "content": prompt}], SamplingParams(temperature=0.0, max_tokens=max_tokens))
    finally:
        del eng.step, proposer.propose, spec.sample
        eng.runner.execute, proposer.runner.execute = orig[1], draft_exec
    st = out[0].extra.get("spec_decode", {})
    rows = []
    for k in ["whole step", "draft: propose (its steps + sync)", "draft: model passes", "target: pass",
              "verify: spec.sample (chain, accept)", "rest of engine.step"]:
        xs = mins.get(k, [])
        if xs:
            rows.append([k, 1e3 * statistics.median(xs), 1e3 * min(xs), statistics.median(xs) / t1_pass])
    print(f"speculative steps {steps['spec']} of {steps['n']}; drafted {st.get('num_draft_tokens')}, accepted "
          f"{st.get('num_accepted_tokens')} ({st.get('acceptance_rate', 0):.2f}), tokens {len(out[0].outputs[0].token_ids)}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--parts", nargs="+", default=["pass", "matmul", "step"], choices=["pass", "matmul", "step"])
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="pass and matmul times by process CPU time (default) or wall clock (--threads 2)")
    ap.add_argument("--loop", type=int, default=0, help="only run passes of this many rows (for perf)")
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    global CLOCK
    CLOCK = time.perf_counter if a.clock == "wall" else time.process_time
    os.environ.setdefault("HITENTER_SPEC_ADAPTIVE", "0")
    os.environ.setdefault("HITENTER_DRAFT_LOOKUP", "0")
    from hitenter import LLM

    q15, q05 = _cached("qwen2.5-coder-1.5b-instruct"), _cached("qwen2.5-coder-0.5b-instruct")
    opts = {"speculative_model": q05, "num_speculative_tokens": a.k} if "step" in a.parts and not a.loop else {}
    llm = LLM(q15, max_model_len=2048, kv_cache_memory=256 << 20, **opts)
    eng = llm.engine
    if a.loop:
        rig = PassRig(eng.runner, eng.kv_manager, a.context, a.loop)
        rig.run(a.loop)
        print(f"loop start (pid {os.getpid()})", flush=True)
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < a.seconds:
            rig.run(a.loop)
            n += 1
        print(f"loop: {n} passes of {a.loop} rows, {1e3 * (time.process_time() - c0) / n:.2f} cpu ms each")
        return 0
    print(cpu_line())
    print(f"{a.clock} time, threads {a.threads}, context {a.context}, rows {a.rows}, min of {a.repeats} (load "
          f"{os.getloadavg()[0]:.2f})")
    passes = pass_part(eng, a.rows, a.repeats, a.context)
    t1, tr = passes[1], passes[a.rows]
    result: dict[str, Any] = {"cpu": cpu_line(), "threads": a.threads, "rows": a.rows,
                              "pass_ms": {r: 1e3 * t for r, t in passes.items()}}
    print("target pass: " + ", ".join(f"{r} rows {1e3 * t:.2f} ms ({t / t1:.2f}x)" for r, t in passes.items()))
    if "matmul" in a.parts:
        rows = matmul_parts(eng.runner.model, a.rows, max(5, a.repeats // 4), t1)
        m1, mr = sum(r[3] for r in rows), sum(r[4] for r in rows)
        rows.append(["all matmuls", sum(r[1] for r in rows), "", m1, mr, mr / m1, (mr - m1) / (1e3 * t1)])
        rows.append(["rest (pass - matmuls)", "", "", 1e3 * t1 - m1, 1e3 * tr - mr,
                     (1e3 * tr - mr) / (1e3 * t1 - m1), ((1e3 * tr - mr) - (1e3 * t1 - m1)) / (1e3 * t1)])
        header = ["part", "weights", "shape", "ms @1", f"ms @{a.rows}", "ratio", "extra (1-row passes)"]
        print(table(rows, header))
        result["matmul"] = [dict(zip(header, r, strict=True)) for r in rows]
    if "step" in a.parts:
        from spec_decode import CODE_PROMPTS

        rows = step_part(llm, CODE_PROMPTS[0], a.max_tokens, t1)
        header = ["part of a speculative step", "median ms", "min ms", "median (1-row passes)"]
        print(table(rows, header))
        result["step"] = [dict(zip(header, r, strict=True)) for r in rows]
    emit_json("spec_verify_profile", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
