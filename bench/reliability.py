"""Reliability under abuse: prints figures, exits non-zero when one is out of bounds.

    python bench/reliability.py [--model PATH|NAME] [--schemathesis-examples N] [--skip-schemathesis]

Starts ``hitenter serve`` (a subprocess, with --api-key) and measures:
- schemathesis over every route of the OpenAPI schema, key set: cases, 5xx, conformance failures;
- ten 10 MB bodies: all 413, and the server's RSS growth across them (bound: < 100 MB); also ten
  prompts just under the body limit (refused by the character bound before tokenizing);
- every /playground/api route without the key: 401.
The default model is a tiny random GGUF (hitenter.testing.tiny_model): the point is the HTTP layer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from hitenter.testing.serve import serve_subprocess

KEY = "sk-reliability"
AUTH = {"Authorization": f"Bearer {KEY}"}


@contextmanager
def served(model: str, extra: list[str]) -> Iterator[tuple[str, int]]:
    with serve_subprocess(["--model", model, "--api-key", KEY, "--extra-model", "none", *extra]) as (url, proc):
        yield url, proc.pid


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def big_bodies(url: str, pid: int, size: int, n: int = 10) -> dict[str, object]:
    body = b'{"prompt": "' + b"a" * size + b'", "max_tokens": 1}'
    before, statuses, t0 = rss_mb(pid), [], time.perf_counter()
    for _ in range(n):
        r = httpx.post(url + "/v1/completions", content=body, headers={**AUTH, "content-type": "application/json"},
                       timeout=120)
        statuses.append(r.status_code)
    return {"bytes": len(body), "statuses": sorted(set(statuses)), "seconds_each": (time.perf_counter() - t0) / n,
            "rss_before_mb": round(before, 1), "rss_after_mb": round(rss_mb(pid), 1),
            "rss_growth_mb": round(rss_mb(pid) - before, 1)}


def playground_without_key(url: str) -> dict[str, object]:
    spec = httpx.get(url + "/openapi.json", headers=AUTH).json()
    ops = [(m.upper(), p) for p, o in spec["paths"].items() for m in o if p.startswith("/playground/api")]
    codes = {f"{m} {p}": httpx.request(m, url + p, json={}, timeout=30).status_code for m, p in ops}
    return {"routes": len(codes), "not_401": {k: v for k, v in codes.items() if v != 401}}


def schemathesis(url: str, examples: int, out: Path) -> dict[str, object]:
    exe = Path(sys.executable).with_name("schemathesis")
    report = out / "st.ndjson"
    cmd = [str(exe), "run", url + "/openapi.json", "-H", f"Authorization: Bearer {KEY}", "-n", str(examples),
           "--checks", "all", "--request-timeout", "30", "--seed", "1", "--max-failures", "200",
           "--exclude-path", "/playground/api/events",        # an endless event stream by design
           "--report", "ndjson", "--report-ndjson-path", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out)     # its .schemathesis cache: there
    lines = proc.stdout.strip().splitlines()
    failures = [ln[:240] for ln in lines if ln.startswith("___") or ln.startswith("- ST") or ln.startswith("    `{")]
    summary = lines[lines.index(next(ln for ln in lines if "SUMMARY" in ln)):] if any("SUMMARY" in ln for ln in lines) \
        else lines[-40:]
    return {"exit": proc.returncode, "summary": "\n".join(failures + summary)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF path or known name (default: a tiny random model)")
    ap.add_argument("--schemathesis-examples", type=int, default=100)
    ap.add_argument("--skip-schemathesis", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hitenter-reliability-"))
    model = a.model
    if model is None:
        from hitenter.testing.tiny_model import write_tiny_gguf
        model = str(write_tiny_gguf(tmp / "tiny.gguf", arch="llama", seed=0))
    results: dict[str, object] = {}
    with served(model, []) as (url, pid):
        results["ten_10MB_bodies"] = big_bodies(url, pid, 10 << 20)
        results["ten_4MB_prompts_under_the_limit"] = big_bodies(url, pid, (4 << 20) - 100)
        results["playground_without_key"] = playground_without_key(url)
        if not a.skip_schemathesis:
            results["schemathesis"] = schemathesis(url, a.schemathesis_examples, tmp)
    summary = results.pop("schemathesis", None)
    print(json.dumps(results, indent=1))
    if isinstance(summary, dict):
        print(f"schemathesis (exit {summary['exit']}):\n{summary['summary']}")
    ok = all(r["statuses"] == [413] and r["rss_growth_mb"] < 100  # type: ignore[index,operator]
             for k, r in results.items() if k.startswith("ten_10MB"))
    ok = ok and not results["playground_without_key"]["not_401"]  # type: ignore[index]
    ok = ok and (summary is None or summary["exit"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
