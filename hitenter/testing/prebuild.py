"""Compile, before a test session's first test and on every core, the native library files its tests load.

Each library is compiled on first use, on one core, while the test that asked waits. On a fresh machine
(CI) a lane compiles about ten files that way, one after another, the portable 16-lane attention build the
slowest by far. Here they are compiled at once, slowest first, one per core, and the session
waits for them: on 2 cores the wall time is about the slowest build's instead of the sum. A warm cache costs a hash of the sources. Nothing is loaded, and the session waits before any test
changes the environment, so every test meets the libraries as it would without this module; a build
that fails is left to the load to report, with its one warning."""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from hitenter.kernels.native import LIBRARIES, QMATMUL, BuildError, NativeLibrary

# the builds by compile time, slowest first (the measured times: docs/benchmarks.md); the rest take little
_SLOWEST_FIRST = [("decode_attention", "portable"), ("qmatmul", "auto"), ("qmatmul", "avx2"),
                  ("decode_attention", ""), ("prompt_attention", "portable"), ("qmatmul", "generic")]

Job = tuple[NativeLibrary, str, str]   # (library, variant, instance tag)


def jobs(node_ids: Iterable[str]) -> list[Job]:
    """Every library's build and instances as the environment selects them, and the qmatmul variants the
    tests force: generic, and any variant a selected test names in its id (`[avx2]`); slowest first. None for
    a library its environment switch turns off."""
    ids = list(node_ids)
    out: list[Job] = []
    for lib in LIBRARIES:
        if not lib.switched_on():
            continue
        variant = lib.chosen_variant() if lib.variants else ""
        out.append((lib, variant, ""))
        out += [(lib, variant, tag) for tag in lib.instances]
        if lib is QMATMUL:
            forced = {"generic"} | {v for v in lib.variants if any(f"[{v}]" in n for n in ids)}
            out += [(lib, v, "") for v in sorted(forced - {variant})]

    def rank(job: Job) -> int:
        key = (job[0].name, job[2] or job[1])
        return _SLOWEST_FIRST.index(key) if key in _SLOWEST_FIRST else len(_SLOWEST_FIRST)

    return sorted(out, key=rank)


def _build(job: Job) -> None:
    lib, variant, tag = job
    try:
        lib.build(variant, tag)
    except (BuildError, ValueError):
        pass   # the library's load reports it (one warning), as it would without this module


def build_all(node_ids: Iterable[str], workers: int | None = None) -> None:
    """Build every file of `jobs(node_ids)` that the cache lacks, `workers` at a time (default: one per core)."""
    with ThreadPoolExecutor(max_workers=workers or len(os.sched_getaffinity(0))) as pool:
        list(pool.map(_build, jobs(node_ids)))
