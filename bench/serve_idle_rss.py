"""What `hitenter serve` holds in memory before and between requests: the server process's RSS at idle.

Each round starts `hitenter serve` (the default model unless --model; its other options after `--`) on a free
port, waits until it answers /health, lets it idle (the engine loop hands freed heap back after a second
idle), and reads /proc/PID/status: VmRSS (split into anonymous and file-backed pages: the weight cache's
map and the libraries are file pages) and VmHWM (the peak, the load included); then after one /health and
one /v1/models request, and the body-check worker's RSS (a child process, counted apart). Medians of the
rounds, the load average before and after. The trees' modules are compiled to bytecode first (a shell
with PYTHONDONTWRITEBYTECODE would compile every changed module in each process otherwise). `--tree DIR`:
the same from another source tree (PYTHONPATH=DIR, e.g. an earlier commit: `git archive <commit> hitenter
| tar -x -C DIR`), alternating with this one.

    .venv/bin/python bench/serve_idle_rss.py [--model NAME] [--rounds 3] [--tree DIR] [-- serve options]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDLE_S = 3.0
FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status(pid: int) -> dict[str, float]:
    """The FIELDS of /proc/PID/status in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in FIELDS:
            out[key] = int(line.split()[1]) / 1024
    return out


def children_rss(pid: int) -> float:
    """RSS of the process's children (the body-check worker) in MB."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += status(int(child)).get("VmRSS", 0.0)
    return total


def get(port: int, path: str, timeout: float = 5.0) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return int(r.status)


def one_round(model: str, tree: str | None, extra: list[str]) -> dict[str, float]:
    port = free_port()
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (tree, env.get("PYTHONPATH")) if x)
    cmd = [sys.executable, "-c", "from hitenter.cli import main; raise SystemExit(main())", "serve",
           *(["--model", model] if model else []), "--port", str(port), *extra]
    # from another folder: `python -c` puts its working folder first on sys.path, before PYTHONPATH
    proc = subprocess.Popen(cmd, env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"hitenter serve exited with {proc.returncode}: {' '.join(cmd)}")
            try:
                if get(port, "/health", 1.0) == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("hitenter serve not ready after 300 s")
            time.sleep(0.3)
        time.sleep(IDLE_S)
        idle = status(proc.pid)
        get(port, "/health")
        get(port, "/v1/models")
        time.sleep(IDLE_S)
        after = status(proc.pid)
        return {**{f"idle {k}": v for k, v in idle.items()}, "after requests VmRSS": after["VmRSS"],
                "body-check worker": children_rss(proc.pid)}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: serve's own default model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", default=None, help="also a hitenter from this source tree, alternating")
    ap.add_argument("serve_args", nargs="*", help="options for hitenter serve (after --)")
    a = ap.parse_args()
    trees = {"this tree": None, **({f"tree {a.tree}": a.tree} if a.tree else {})}
    for tree in (ROOT, *([Path(a.tree)] if a.tree else [])):   # bytecode written, as an installed package's
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "hitenter")], check=True,
                       stdout=subprocess.DEVNULL)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(a.rounds):
        for name, tree in trees.items():
            got = one_round(a.model, tree, a.serve_args)
            runs[name].append(got)
            print(f"round {r} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in got.items()), flush=True)
    load_after = os.getloadavg()
    print(f"\nhitenter serve --model {a.model or '(default)'} {' '.join(a.serve_args)}: medians of {a.rounds} rounds, MB")
    for name, rows in runs.items():
        print(f"  {name}: " + ", ".join(f"{k} {statistics.median(x[k] for x in rows):.1f}" for k in rows[0]))
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f}")


if __name__ == "__main__":
    main()
