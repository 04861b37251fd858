"""hitenter beside llama.cpp on one GGUF in alternating rounds, for a machine other work loads too.

    .venv/bin/python bench/vs_llamacpp_rounds.py --model /work/models/gemma4-e2b-syn.gguf --rounds 5 \
        --prefill 128 512 --decode 32 --llamacpp-no-repack

Both engines load once, each in its own process (hitenter's LLM; llama-cpp-python from --llamacpp-python),
and then take turns: each round runs every workload on one engine then the other, the order flipped every
round (ABBA), so a change of the machine's load falls on both. Reported per workload: the median tokens/s of
each engine and the median of the rounds' ratios (hitenter / llama.cpp), by wall time and by the process's
CPU time (the figure to read on a loaded machine, where wall time also measures how each engine's threads
fare beside other processes; a thread spinning while it waits counts as CPU time), and the load average
(`uptime`'s 1-minute figure) at each round. Workloads: a prefill of N prompt tokens
(one request, one new token), and decode at batch 1 (tokens/s over --decode tokens after a 16-token prompt).
bench/vs_llamacpp.py reports memory and a roofline for the same file; this script only rates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line, llamacpp_env  # noqa: E402

N_CTX = 4096
# a worker reads "prefill N" / "decode N" lines and answers each with its tokens/s; "ready" once loaded
LLAMACPP_WORKER = r"""
import sys, time
from llama_cpp import Llama
path, threads = sys.argv[1], int(sys.argv[2])
if sys.argv[3:] == ["no-repack"]:   # llama.cpp's extra (repacked) CPU buffer types off
    import llama_cpp, llama_cpp.llama as lm
    defaults = llama_cpp.llama_model_default_params
    def params():
        p = defaults(); p.use_extra_bufts = False; return p
    lm.llama_cpp.llama_model_default_params = params
llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
print("ready", flush=True)
for line in sys.stdin:
    kind, n = line.split(); n = int(n)
    llm.reset()
    if kind == "prefill":
        toks = [100 + (i * 7919) % 40000 for i in range(n)]
        t0, c0 = time.perf_counter(), time.process_time(); llm.eval(toks)
    else:
        llm.eval([100 + i for i in range(16)])
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n): llm.eval([200 + i])
    print(n / (time.perf_counter() - t0), n / (time.process_time() - c0), flush=True)
"""


def hitenter_worker(path: str, threads: int, max_prefill: int) -> None:
    """The hitenter side of the protocol (LLAMACPP_WORKER's), on stdin / stdout."""
    import time

    import torch

    from hitenter import LLM, SamplingParams
    from hitenter.models.gguf import model_config_from_metadata, read_gguf_metadata

    torch.set_num_threads(threads)
    mcfg = model_config_from_metadata(read_gguf_metadata(path))
    budget = {"max_num_seqs": 1} if mcfg.layer_types else {"kv_cache_memory": mcfg.kv_bytes_per_token(4) * N_CTX}
    llm = LLM(path, enable_prefix_caching=False, max_num_batched_tokens=max_prefill, max_model_len=N_CTX, **budget)
    print("ready", flush=True)
    for line in sys.stdin:
        kind, n_s = line.split()
        n = int(n_s)
        if kind == "prefill":
            toks = [100 + (i * 7919) % 40000 for i in range(n)]
            t0, c0 = time.perf_counter(), time.process_time()
            llm.generate([toks], SamplingParams(temperature=0, max_tokens=1))
            rate, cpu_rate = n / (time.perf_counter() - t0), n / (time.process_time() - c0)
        else:   # from the first token's output to the last's (the prompt's prefill left out)
            times: list[tuple[float, float]] = []
            llm.generate([list(range(100, 116))], SamplingParams(temperature=0, max_tokens=n + 1, ignore_eos=True),
                         on_output=lambda o, t=times: t.append((time.perf_counter(), time.process_time())))
            rate = (len(times) - 1) / (times[-1][0] - times[0][0])
            cpu_rate = (len(times) - 1) / (times[-1][1] - times[0][1])
        print(rate, cpu_rate, flush=True)


class Worker:
    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if self._line() != "ready":
            raise RuntimeError(f"worker {cmd[0]} did not start")

    def _line(self) -> str:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("worker exited")
        return line.strip()

    def rate(self, job: str) -> tuple[float, float]:
        """(tokens per second of wall time, tokens per second of the process's CPU time) of one job."""
        assert self.p.stdin is not None
        self.p.stdin.write(job + "\n")
        self.p.stdin.flush()
        wall, cpu = self._line().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=60)


def load1() -> float:
    return os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefill", type=int, nargs="*", default=[512])
    ap.add_argument("--decode", type=int, default=32, help="decode tokens per round (0: no decode workload)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llamacpp-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--llamacpp-no-repack", action="store_true",
                    help="llama.cpp without its repacked CPU buffers (it segfaults with them on AVX-512 + AMX)")
    ap.add_argument("--llamacpp-lib", metavar="DIR", help="load llama.cpp from DIR/libllama.so (e.g. "
                    "bench/build_llamacpp_avx2.sh's AVX2-only build) instead of llama-cpp-python's own")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        hitenter_worker(a.model, a.threads, max(a.prefill or [512]))
        return
    jobs = [f"prefill {n}" for n in a.prefill] + ([f"decode {a.decode}"] if a.decode else [])
    ours = Worker([sys.executable, __file__, "--worker", "--model", a.model, "--threads", str(a.threads),
                   "--prefill", *map(str, a.prefill or [512])])
    theirs = Worker([a.llamacpp_python, "-c", LLAMACPP_WORKER, a.model, str(a.threads),
                     *(["no-repack"] if a.llamacpp_no_repack else [])], env=llamacpp_env(a.llamacpp_lib))
    for job in jobs:   # warm-up, not counted
        ours.rate(job)
        theirs.rate(job)
    rates: dict[str, list[list[tuple[float, float]]]] = {j: [[], []] for j in jobs}   # [ours, theirs] per round
    loads: list[float] = []
    for r in range(a.rounds):
        loads.append(load1())
        for job in jobs:
            first, second = (ours, theirs) if r % 2 == 0 else (theirs, ours)
            x, y = first.rate(job), second.rate(job)
            h, l_ = (x, y) if first is ours else (y, x)
            rates[job][0].append(h)
            rates[job][1].append(l_)
        print(f"round {r + 1}: load {loads[-1]:.2f} " + "  ".join(
            f"{j}: {rates[j][0][-1][0]:.2f} / {rates[j][1][-1][0]:.2f}" for j in jobs), flush=True)
    ours.close()
    theirs.close()
    print(cpu_line(), f"| {a.threads} threads")
    print(f"{a.model}: {a.rounds} alternating rounds, load average (1 min) per round "
          f"{' '.join(f'{x:.1f}' for x in loads)}")
    print(f"{'workload (tok/s)':>18}  {'hitenter':>9}  {'llama.cpp':>9}  {'ratio':>6}  "
          f"{'per CPU second: hitenter':>24}  {'llama.cpp':>9}  {'ratio':>6}")
    out = {}
    for j in jobs:
        res: dict[str, float] = {}
        for k, name in ((0, "wall"), (1, "cpu")):
            h = [x[k] for x in rates[j][0]]
            l_ = [x[k] for x in rates[j][1]]
            res[f"hitenter_{name}"], res[f"llamacpp_{name}"] = statistics.median(h), statistics.median(l_)
            res[f"ratio_{name}"] = statistics.median(x / y for x, y in zip(h, l_, strict=True))
        out[j.replace(" ", "_")] = res
        print(f"{j:>18}  {res['hitenter_wall']:9.2f}  {res['llamacpp_wall']:9.2f}  {res['ratio_wall']:6.2f}  "
              f"{res['hitenter_cpu']:24.2f}  {res['llamacpp_cpu']:9.2f}  {res['ratio_cpu']:6.2f}")
    print("JSON " + json.dumps({"bench": "vs_llamacpp_rounds", "model": a.model, "rounds": a.rounds,
                                "loads": loads, "results": out}))

if __name__ == "__main__":
    main()
