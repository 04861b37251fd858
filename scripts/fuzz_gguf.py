"""Fuzz the GGUF loader with mutated tiny GGUFs: a longer run of tests/models/test_gguf_hostile.py's fuzzer.

Each case is a seeded mutant (hitenter/testing/gguf_fuzz.py: truncations, boundary counts and lengths, bad
UTF-8, overlapping / misaligned tensors, wrong and unknown types, metadata of the wrong type, hostile chat
templates, random flips) of one of several tiny GGUFs (a Llama with Q8_0 blocks, a Qwen2 with K-quants, a
Qwen3-MoE with 3-D expert tensors, a Gemma 3), loaded as serving does (gguf_fuzz.load_variant). Cases run
in forked workers, BATCH at a time, each worker under an address-space limit (--mem-gb), each case under a
SIGALRM guard (--case-seconds): a crash (a signal), a hang, a memory bomb or any exception other than a
one-line ModelLoadError / a template's ValueError is a finding, printed with the base, seed and case index
that reproduce it. Exit status 1 when anything was found.

    .venv/bin/python scripts/fuzz_gguf.py --cases 2000 [--seed 0] [--case-seconds 10] [--mem-gb 4]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

BATCH = 50


def _bases(d: Path) -> dict[str, bytes]:
    from hitenter.testing.tiny_families import write_tiny_family
    from hitenter.testing.tiny_model import write_tiny_gguf

    files = {
        "llama-q8_0": write_tiny_gguf(d / "llama.gguf", quant="Q8_0"),
        "qwen2-kquants": write_tiny_gguf(d / "qwen2.gguf", arch="qwen2",
                                         quant={"ffn_down": "Q4_K", "attn_v": "Q6_K", "token_embd": "Q8_0"}),
        "qwen3moe-q8_0": write_tiny_family(d / "qwen3moe.gguf", "qwen3moe", quant="Q8_0"),
        "gemma3-f32": write_tiny_family(d / "gemma3.gguf", "gemma3"),
    }
    return {name: p.read_bytes() for name, p in files.items()}


class _Slow(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Slow()


def _run_batch(base: bytes, seed: int, first: int, count: int, case_seconds: float, mem_gb: float,
               workdir: str, out: mp.Queue) -> None:
    """Worker: cases first..first+count-1 of the (base, seed) stream; one result line per case."""
    from hitenter.testing.gguf_fuzz import load_variant, mutants

    limit = int(mem_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    rng = np.random.default_rng(seed)
    path = Path(workdir) / f"case-{os.getpid()}.gguf"
    for i, (kind, label, variant) in enumerate(mutants(base, rng, first + count)):
        if i < first:
            continue
        path.write_bytes(variant)
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, case_seconds)
        try:
            result = load_variant(path, dense=i % 3 == 0)
            verdict = "ok:" + result.split(":")[0]
        except _Slow:
            verdict = f"FOUND: slower than {case_seconds} s"
        except BaseException as e:   # noqa: BLE001 -- anything else is the finding this script reports
            verdict = f"FOUND: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        out.put((i, kind, label, verdict, time.monotonic() - t0))
    path.unlink(missing_ok=True)


def _batch(ctx: mp.context.BaseContext, base: bytes, seed: int, first: int, count: int,
           args: argparse.Namespace, workdir: str) -> list[tuple[int, str, str, str, float]]:
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_run_batch, args=(base, seed, first, count, args.case_seconds, args.mem_gb, workdir, q))
    p.start()
    rows: list[tuple[int, str, str, str, float]] = []
    deadline = time.monotonic() + count * (args.case_seconds + 2) + 30
    while len(rows) < count and (p.is_alive() or not q.empty()) and time.monotonic() < deadline:
        try:
            rows.append(q.get(timeout=1))
        except Exception:   # queue.Empty: poll the worker again
            continue
    p.join(timeout=5)
    if p.is_alive():
        p.kill()
        p.join()
    if len(rows) < count:   # the worker died (a signal) or hung outside the guard: the next case is the finding
        nxt = first + len(rows)
        why = f"worker died with {p.exitcode}" if p.exitcode else "worker hung"
        rows.append((nxt, "?", f"case {nxt}", f"FOUND: {why}", 0.0))
        if nxt + 1 < first + count:
            rows += _batch(ctx, base, seed, nxt + 1, first + count - nxt - 1, args, workdir)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=400, help="cases per base file (default 400)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case-seconds", type=float, default=10.0, help="a case slower than this is a finding")
    ap.add_argument("--mem-gb", type=float, default=4.0, help="address-space limit of each worker")
    args = ap.parse_args()

    import hitenter.models.loader  # noqa: F401 -- imported once here, shared by every forked worker
    import hitenter.tokenizer.bpe  # noqa: F401

    ctx = mp.get_context("fork")
    found, outcomes, t_start = [], Counter(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz_gguf_") as tmp:
        for b, (name, base) in enumerate(_bases(Path(tmp)).items()):
            seed = args.seed * 1000 + b
            t0 = time.monotonic()
            for first in range(0, args.cases, BATCH):
                for i, kind, label, verdict, dt in _batch(ctx, base, seed, first, min(BATCH, args.cases - first),
                                                          args, tmp):
                    outcomes[(kind, verdict.split(":")[1] if verdict.startswith("ok:") else "FOUND")] += 1
                    if verdict.startswith("FOUND"):
                        found.append(f"{name} seed {seed} case {i} [{kind}] {label}: {verdict[7:]}")
            dt = time.monotonic() - t0
            print(f"{name}: {args.cases} cases in {dt:.1f} s ({args.cases / dt:.1f} cases/s)", flush=True)
    for (kind, verdict), n in sorted(outcomes.items()):
        print(f"  {kind:14s} {verdict:18s} {n}")
    total = sum(outcomes.values())
    print(f"{total} cases in {time.monotonic() - t_start:.1f} s; {len(found)} findings")
    for f in found:
        print("FOUND", f)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
