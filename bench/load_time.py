"""How long a fresh process takes to be ready to generate, hitenter vs llama.cpp, on one GGUF (warm page cache).

Each round starts one process per engine, alternating: `python -c` that imports the engine and loads the
file (hitenter: `LLM(model)`; llama.cpp: `llama_cpp.Llama(model_path, n_ctx)`, through
/work/venvs/llamacpp with its extra CPU buffer types off: this llama.cpp build crashes with its repacked
buffers on AVX-512 + AMX machines) and prints READY. The figure is the wall time from the start of the
process to READY: interpreter start, imports and load included; the child's own split (imports / load)
is printed beside it. Medians of the rounds and their ratio; the load average before and after. The trees'
modules are compiled to bytecode first (compile_tree), as an installed package's are.

Then memory: a first hitenter process loads the model and waits; a second one on the same file loads
it too; what the second adds to the machine's used memory (MemTotal - MemAvailable) is reported beside
its private (anonymous) RSS and the file's size. Pages of a mapped file (the weight cache, the GGUF)
are shared, so the second process adds its private memory only.

    .venv/bin/python bench/load_time.py [--model qwen2.5-coder-1.5b-instruct] [--rounds 5]
        [--llama-python /work/venvs/llamacpp/bin/python] [--no-llamacpp] [--no-memory] [--tree DIR]

`--tree DIR`: also a hitenter process run from another source tree (PYTHONPATH=DIR; e.g. an earlier
commit, `git archive <commit> hitenter | tar -x -C DIR`), in the same alternating rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import baseline_env

ROOT = Path(__file__).resolve().parents[1]

HITENTER = """
import time, sys
t0 = time.perf_counter()
from hitenter import LLM
t1 = time.perf_counter()
llm = LLM(sys.argv[1])
t2 = time.perf_counter()
print(f"READY import={t1 - t0:.3f} load={t2 - t1:.3f}", flush=True)
if len(sys.argv) > 2:
    sys.stdin.readline()
"""

LLAMACPP = """
import time, sys
t0 = time.perf_counter()
import llama_cpp
t1 = time.perf_counter()
defaults = llama_cpp.llama_cpp.llama_model_default_params
def params():
    p = defaults()
    p.use_extra_bufts = False
    return p
llama_cpp.llama_cpp.llama_model_default_params = params
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), verbose=False)
t2 = time.perf_counter()
print(f"READY import={t1 - t0:.3f} load={t2 - t1:.3f}", flush=True)
"""


def uptime() -> str:
    return Path("/proc/loadavg").read_text().split(" 1")[0].strip() if Path("/proc/loadavg").exists() else "?"


def tree_env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([tree, *filter(None, [os.environ.get("PYTHONPATH")])])}


def run_ready(argv: list[str], env: dict[str, str] | None = None, cwd: str | Path = ROOT) -> tuple[float, str]:
    """Wall seconds from the process's start to its READY line (its exit not counted), and that line."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    assert p.stdout is not None
    line = ""
    for ln in p.stdout:
        if ln.startswith("READY"):
            line = ln.strip()
            break
    wall = time.perf_counter() - t0
    _, err = p.communicate(timeout=600)
    if not line:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{err[-2000:]}")
    return wall, line


def compile_tree(tree: Path) -> None:
    """Write the bytecode of the tree's hitenter modules, as an installed package has it: with
    PYTHONDONTWRITEBYTECODE set (as it may be in a development shell) every module changed since its
    .pyc was written would otherwise be compiled again by each process, which is not what a user's start pays."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "hitenter")], check=True,
                   stdout=subprocess.DEVNULL)


def mem_used() -> int:
    info = dict(ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024


def rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup's byte counts (Rss, Pss, Shared_Clean, Private_Dirty, Anonymous, ...)."""
    out = {}
    for ln in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        k, v = ln.split(":", 1)
        out[k] = int(v.split()[0]) * 1024
    return out


def held(model: str, tree: str | None) -> subprocess.Popen[str]:
    """A hitenter process (from `tree`, or this one) that has loaded `model` and waits for a line on stdin."""
    p = subprocess.Popen([sys.executable, "-c", HITENTER, model, "hold"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=tree or ROOT,
                         env=tree_env(tree) if tree else None)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("READY"):
        p.kill()
        raise SystemExit("the held hitenter process did not load")
    return p


def memory(model: str, size: int, tree: str | None = None) -> None:
    first = held(model, tree)
    time.sleep(1.0)
    before = mem_used()
    second = held(model, tree)
    time.sleep(1.0)
    added, r = mem_used() - before, rollup(second.pid)
    own = r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
    for p in (second, first):
        p.communicate("\n", timeout=60)
    print(f"{'hitenter from ' + tree if tree else 'hitenter'}: second process on the same file: RSS {r['Rss'] / 1e6:.0f} MB, of it private {own / 1e6:.0f} MB "
          f"({100 * own / size:.1f}% of the {size / 1e6:.0f} MB file; anonymous {r.get('Anonymous', 0) / 1e6:.0f} MB) "
          f"and shared {r.get('Shared_Clean', 0) / 1e6:.0f} MB; the machine's used memory +{added / 1e6:.0f} MB "
          f"(other processes move it too); load average {uptime()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n-ctx", type=int, default=4096, help="llama.cpp's context (hitenter: its default)")
    ap.add_argument("--llama-python", default="/work/venvs/llamacpp/bin/python")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--tree", help="also time hitenter from this source tree (PYTHONPATH)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from hitenter.models.registry import resolve_model

    path = str(resolve_model(args.model))
    size = os.path.getsize(path)
    print(f"{args.model}: {path} ({size / 1e6:.0f} MB); load average {uptime()}")
    for tree in (ROOT, *([args.tree] if args.tree else [])):
        compile_tree(Path(tree))
    run_ready([sys.executable, "-c", HITENTER, args.model])   # warm: page cache, weight cache, kernels built
    if not args.no_llamacpp:
        run_ready([args.llama_python, "-c", LLAMACPP, path, str(args.n_ctx)], baseline_env())
    if args.tree:
        run_ready([sys.executable, "-c", HITENTER, args.model], tree_env(args.tree), args.tree)
    ours: list[float] = []
    theirs: list[float] = []
    tree: list[float] = []
    for r in range(args.rounds):
        wall, line = run_ready([sys.executable, "-c", HITENTER, args.model])
        ours.append(wall)
        msg = f"round {r + 1}: hitenter {wall:.2f} s ({line[6:]})"
        if args.tree:
            wall, line = run_ready([sys.executable, "-c", HITENTER, args.model], tree_env(args.tree), args.tree)
            tree.append(wall)
            msg += f", hitenter from {args.tree} {wall:.2f} s ({line[6:]})"
        if not args.no_llamacpp:
            wall, line = run_ready([args.llama_python, "-c", LLAMACPP, path, str(args.n_ctx)], baseline_env())
            theirs.append(wall)
            msg += f", llama.cpp {wall:.2f} s ({line[6:]})"
        print(f"{msg}; load average {uptime()}", flush=True)
    med = statistics.median(ours)
    summary = f"median ready: hitenter {med:.2f} s"
    if theirs:
        summary += f", llama.cpp {statistics.median(theirs):.2f} s, ratio {med / statistics.median(theirs):.2f}x"
    if tree:
        summary += f", hitenter from {args.tree} {statistics.median(tree):.2f} s"
    print(f"{summary}; load average {uptime()}")
    if not args.no_memory:
        memory(args.model, size)
        if args.tree:
            memory(args.model, size, args.tree)


if __name__ == "__main__":
    main()
