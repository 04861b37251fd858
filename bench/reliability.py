"""Reliability under abuse: prints figures, exits non-zero when one is out of bounds.

    python bench/reliability.py [--model PATH|NAME] [--schemathesis-examples N] [--skip-schemathesis]
                                [--only-attacks | --only-schemathesis] [--rounds N]

Starts ``hitenter serve`` (a subprocess, with --api-key) and measures:
- schemathesis over every route of the OpenAPI schema, key set: cases, 5xx, conformance failures;
- ten 10 MB bodies: all 413, and the server's RSS growth across them (bound: < 100 MB); also ten
  prompts just under the body limit (refused by the character bound before tokenizing);
- every /playground/api route without the key: 401;
- the attacks of issue 32 (deep schemas, string schemas, tool-call arguments and bodies; guided_choice of
  100k, an enum of 100k, a 1M-character pattern and regex; 100k stop strings): status, seconds, RSS
  before/after each (bounds: a 4xx within 1 s, RSS within 200 MB of idle);
- the server's CPU per refusal while one client loops the refused 1 MB grammars (and the helper
  processes', i.e. the body-check worker's);
- 16 streams' tokens/s alone, while one client sends the pathological grammars in a loop, and while one
  sends grammars at the size limits (1024 fresh choices each, so never cached), in alternating runs,
  each attacked run over the mean of the alone runs either side (bound: median >= 0.8).
The default model is a tiny random GGUF (hitenter.testing.tiny_model): the point is the HTTP layer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    """schemathesis over every route (but the endless event stream), key set, every check but positive
    data acceptance (as tests/server/test_reliability.py: some schema-valid requests are refused for
    rules a JSON schema cannot state, e.g. 90.0 is a JSON Schema integer and our types are strict, or a
    tool role the model's template lacks); the statuses and check results counted from its report."""
    exe = Path(sys.executable).with_name("schemathesis")
    report = out / "st.ndjson"
    cmd = [str(exe), "run", url + "/openapi.json", "-H", f"Authorization: Bearer {KEY}", "-n", str(examples),
           "--checks", "all", "--exclude-checks", "positive_data_acceptance", "--request-timeout", "30",
           "--seed", "1", "--max-failures", "200", "--exclude-path", "/playground/api/events",
           "--report", "ndjson", "--report-ndjson-path", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out)     # its .schemathesis cache: there
    statuses: dict[str, int] = {}
    failed: dict[str, int] = {}
    for line in report.read_text().splitlines() if report.exists() else []:
        rec = json.loads(line).get("ScenarioFinished", {}).get("recorder") or {}
        for it in (rec.get("interactions") or {}).values():
            code = str((it.get("response") or {}).get("status_code"))
            statuses[code] = statuses.get(code, 0) + 1
        for checks in (rec.get("checks") or {}).values():
            for c in checks:
                if c["status"] != "success":
                    failed[c["name"]] = failed.get(c["name"], 0) + 1
    lines = proc.stdout.strip().splitlines()
    tail = [ln for ln in lines if ln.startswith(("___", "- ", "    `{")) or "generated" in ln or "Tested" in ln]
    return {"exit": proc.returncode, "command": " ".join(cmd).replace(KEY, "KEY"),
            "cases": sum(statuses.values()), "statuses": dict(sorted(statuses.items())),
            "5xx": sum(n for c, n in statuses.items() if c.startswith("5")), "failed_checks": failed,
            "summary": "\n".join(tail[-60:])}


D = 1000
DEEP = '{"type":"object","properties":{"a":' * D + '{"type":"string"}' + "}}" * D
USER = [{"role": "user", "content": "hi"}]


def _chat(**extra: object) -> bytes:
    return json.dumps({"messages": USER, "max_tokens": 1, **extra}).encode()


def attack_bodies() -> list[tuple[str, str, bytes]]:
    chat, msgs = "/v1/chat/completions", json.dumps(USER)
    head = '{"messages":' + msgs + ',"max_tokens":1'
    args = json.dumps("[" * D + "]" * D)
    return [
        ("schema nested 1000 (response_format)", chat, (head + ',"response_format":{"type":"json_schema",'
         '"json_schema":{"name":"x","schema":' + DEEP + '}}}').encode()),
        ("string schema nested 1000 (guided_json)", chat, (head + ',"guided_json":' + json.dumps(DEEP) + '}').encode()),
        ("structured_outputs.json string nested 1000", chat,
         (head + ',"structured_outputs":{"json":' + json.dumps(DEEP) + '}}').encode()),
        ("tool_calls arguments nested 1000", chat, ('{"max_tokens":1,"messages":[{"role":"user","content":"hi"},'
         '{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f",'
         '"arguments":' + args + '}}]},{"role":"tool","tool_call_id":"c","content":"x"}]}').encode()),
        ("tool parameters nested 1000", chat, (head + ',"tools":[{"type":"function","function":{"name":"f",'
         '"parameters":' + DEEP + '}}],"tool_choice":"required"}').encode()),
        ("body nested 100k", chat, (head + ',"logit_bias":' + "[" * 100_000 + "]" * 100_000 + '}').encode()),
        ("ollama format nested 1000", "/api/chat", ('{"model":"%s","messages":' + msgs + ',"format":' + DEEP
                                                    + ',"stream":false}').encode()),
        ("anthropic output_config nested 1000", "/v1/messages", ('{"model":"%s","max_tokens":1,"messages":' + msgs
         + ',"output_config":{"format":{"type":"json_schema","schema":' + DEEP + '}}}').encode()),
        ("responses text.format nested 1000", "/v1/responses", ('{"model":"%s","input":"hi","max_output_tokens":1,'
         '"text":{"format":{"type":"json_schema","name":"x","schema":' + DEEP + '}}}').encode()),
        ("stop: 100k strings", chat, _chat(stop=["ab"] * 100_000)),
        ("logit_bias: 100k entries", chat, _chat(logit_bias={str(i): 1 for i in range(100_000)})),
        ("guided_choice: 100k choices", chat, _chat(guided_choice=[f"c{i}" for i in range(100_000)])),
        ("json_schema enum: 100k values", chat, _chat(guided_json={"enum": [f"c{i}" for i in range(100_000)]})),
        ("pattern: 1M characters", chat, _chat(guided_json={"type": "string", "pattern": "a" * 1_000_000})),
        ("guided_regex: 1M characters", chat, _chat(guided_regex="a" * 1_000_000)),
    ]


def attacks(url: str, pid: int, model: str) -> list[dict[str, object]]:
    out = []
    idle = rss_mb(pid)
    with httpx.Client(headers={**AUTH, "content-type": "application/json"}, timeout=600) as c:
        for name, path, body in attack_bodies():
            before, t0 = rss_mb(pid), time.perf_counter()
            r = c.post(url + path, content=body.replace(b'"%s"', json.dumps(model).encode()))
            dt = time.perf_counter() - t0
            msg = r.json()
            msg = msg.get("error", msg) if isinstance(msg, dict) else msg
            msg = msg.get("message", msg) if isinstance(msg, dict) else msg
            out.append({"attack": name, "status": r.status_code, "seconds": round(dt, 3),
                        "rss_before_mb": round(before, 1), "rss_after_mb": round(rss_mb(pid), 1),
                        "rss_over_idle_mb": round(rss_mb(pid) - idle, 1), "answer": str(msg)[:100]})
    return out


async def _stream(c: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[int, float]:
    body = {"messages": USER, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0}
    n, t0 = 0, time.perf_counter()
    async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                n += 1
    return n, time.perf_counter() - t0


async def _streams(url: str, n: int, max_tokens: int) -> float:
    async with httpx.AsyncClient(headers=AUTH, timeout=600) as c:
        res = await asyncio.gather(*[_stream(c, url, max_tokens) for _ in range(n)])
    return sum(k / t for k, t in res) / n


GRAMMAR_ATTACKS = [b for name, _, b in attack_bodies() if any(w in name for w in ("choice", "enum", "pattern", "regex"))]


def _attacker(url: str, stop: Any, at_limit: bool, result: Any) -> None:
    """In its own process (a thread would take the measuring client's GIL and skew its tokens/s)."""
    i, bodies, counts = 0, GRAMMAR_ATTACKS, {}
    with httpx.Client(headers={**AUTH, "content-type": "application/json"}, timeout=600) as c:
        while not stop.is_set():
            i += 1
            body = (_chat(guided_choice=[f"fresh-{i}-{j}" for j in range(1024)]) if at_limit
                    else bodies[i % len(bodies)])
            r = c.post(url + "/v1/chat/completions", content=body)
            key = str(r.status_code)
            counts[key] = counts.get(key, 0) + 1
    result.put(counts)


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _cpu_s(pid: int, fields: tuple[int, ...] = (11, 12)) -> float:
    """utime (+ stime) of a process in seconds (/proc/PID/stat fields 14 and 15)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f[i]) for i in fields) / os.sysconf("SC_CLK_TCK")


def attacker_cost(url: str, pid: int, seconds: float = 6.0) -> dict[str, object]:
    """The pathological attacker alone: its rate (paced once it has been refused a few times), the server's
    CPU per refusal (user time ~ what holds the GIL) and the helper processes' (the niced body-check
    worker). CPU time, so less at the mercy of the load than tokens/s."""
    procs = [pid, *_children(pid)]
    before = [(_cpu_s(p), _cpu_s(p, (11,))) for p in procs]
    ctx = multiprocessing.get_context("fork")
    stop, result = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_attacker, args=(url, stop, False, result), daemon=True)
    proc.start()
    time.sleep(seconds)
    stop.set()
    counts = result.get(timeout=120)
    proc.join(timeout=60)
    n = max(1, sum(counts.values()))
    after = [(_cpu_s(p), _cpu_s(p, (11,))) for p in procs]
    ms = [((a[0] - b[0]) / n * 1e3, (a[1] - b[1]) / n * 1e3) for a, b in zip(after, before, strict=True)]
    return {"seconds": seconds, "refusals": counts, "refusals_per_s": round(n / seconds, 1),
            "server_cpu_ms_per_refusal": round(ms[0][0], 2),
            "server_user_ms_per_refusal": round(ms[0][1], 2),
            "helpers_cpu_ms_per_refusal": round(sum(m[0] for m in ms[1:]), 2),
            "server_user_ms_per_s": round(ms[0][1] * n / seconds, 1)}     # the attack's share of the interpreter


def _attacked(url: str, n: int, max_tokens: int, at_limit: bool) -> tuple[float, dict[str, int]]:
    ctx = multiprocessing.get_context("fork")
    stop, result = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_attacker, args=(url, stop, at_limit, result), daemon=True)
    proc.start()
    time.sleep(0.5)
    tps = asyncio.run(_streams(url, n, max_tokens))
    stop.set()
    counts = result.get(timeout=120)
    proc.join(timeout=60)
    return tps, counts


def streams_under_attack(url: str, pid: int, n: int = 16, max_tokens: int = 64, rounds: int = 10) -> dict[str, object]:
    """Rounds of: the streams alone, with the pathological attacker, alone, with the at-the-limits one, ...
    (and alone at the end). Each attacked run's ratio is to the mean of the alone runs either side of it
    (the machine is shared and its load swings within a minute: only ratios taken close together mean
    much); the figures are the medians of those ratios."""
    asyncio.run(_streams(url, 2, 4))                         # warm up
    idle, peak = rss_mb(pid), 0.0
    alone = [asyncio.run(_streams(url, n, max_tokens))]
    ratios: dict[str, list[float]] = {"pathological": [], "at_the_limits": []}
    tps: dict[str, list[float]] = {"pathological": [], "at_the_limits": []}
    counts: dict[str, dict[str, int]] = {"pathological": {}, "at_the_limits": {}}
    for i in range(rounds):
        label = "pathological" if i % 2 == 0 else "at_the_limits"
        v, c = _attacked(url, n, max_tokens, label == "at_the_limits")
        peak = max(peak, rss_mb(pid))
        alone.append(asyncio.run(_streams(url, n, max_tokens)))
        tps[label].append(v)
        ratios[label].append(v / ((alone[-2] + alone[-1]) / 2))
        for k, m in c.items():
            counts[label][k] = counts[label].get(k, 0) + m
    out: dict[str, object] = {"streams": n, "max_tokens": max_tokens, "rounds": rounds,
                              "rss_idle_mb": round(idle, 1),
                              "tokens_per_s_per_stream_alone": round(statistics.median(alone), 2),
                              "alone_runs": [round(v, 1) for v in alone]}
    for label in ratios:
        out[f"with_{label}_attacker"] = {"ratio": round(statistics.median(ratios[label]), 3),
                                         "ratios": [round(r, 2) for r in ratios[label]],
                                         "tokens_per_s_per_stream": [round(v, 1) for v in tps[label]],
                                         "attacker_statuses": counts[label],
                                         "rss_over_idle_mb": round(max(peak, rss_mb(pid)) - idle, 1)}
    out["helper_processes_rss_mb"] = {str(k): round(rss_mb(k), 1) for k in _children(pid)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF path or known name (default: a tiny random model)")
    ap.add_argument("--schemathesis-examples", type=int, default=25, help="per route (25: about 5,000 cases)")
    ap.add_argument("--only-schemathesis", action="store_true")
    ap.add_argument("--skip-schemathesis", action="store_true")
    ap.add_argument("--rounds", type=int, default=10, help="attacked runs of the 16 streams (alternating kinds)")
    ap.add_argument("--only-attacks", action="store_true", help="only the issue-32 attacks and the 16 streams")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hitenter-reliability-"))
    model = a.model
    if model is None:
        from hitenter.testing.tiny_model import write_tiny_gguf
        model = str(write_tiny_gguf(tmp / "tiny.gguf", arch="llama", seed=0))
    results: dict[str, object] = {}
    with served(model, []) as (url, pid):
        name = httpx.get(url + "/v1/models", headers=AUTH).json()["data"][0]["id"]
        if not a.only_schemathesis:
            results["attacks"] = attacks(url, pid, name)
            results["attacker_cost"] = attacker_cost(url, pid)
            results["streams_under_attack"] = streams_under_attack(url, pid, rounds=a.rounds)
        if not a.only_attacks and not a.only_schemathesis:
            results["ten_10MB_bodies"] = big_bodies(url, pid, 10 << 20)
            results["ten_4MB_prompts_under_the_limit"] = big_bodies(url, pid, (4 << 20) - 100)
            results["playground_without_key"] = playground_without_key(url)
        if not a.skip_schemathesis and not a.only_attacks:
            results["schemathesis"] = schemathesis(url, a.schemathesis_examples, tmp)
    summary = results.pop("schemathesis", None)
    print(json.dumps(results, indent=1))
    if isinstance(summary, dict):
        print(f"schemathesis (exit {summary.pop('exit')}):\n{summary.pop('summary')}\n{json.dumps(summary, indent=1)}")
    ok = all(r["statuses"] == [413] and r["rss_growth_mb"] < 100  # type: ignore[index,operator]
             for k, r in results.items() if k.startswith("ten_10MB"))
    ok = ok and not results.get("playground_without_key", {"not_401": {}})["not_401"]  # type: ignore[index]
    ok = ok and all(400 <= r["status"] < 500 and r["seconds"] < 1 and r["rss_over_idle_mb"] < 200  # type: ignore[operator]
                    for r in results.get("attacks", []))  # type: ignore[union-attr,attr-defined]
    sua = results.get("streams_under_attack")
    ok = ok and (sua is None or all(sua[k]["ratio"] >= 0.8 and sua[k]["rss_over_idle_mb"] < 200  # type: ignore[index]
                                    for k in ("with_pathological_attacker", "with_at_the_limits_attacker")))
    ok = ok and (summary is None or summary["5xx"] == 0 and not summary["failed_checks"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
