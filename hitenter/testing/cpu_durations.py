"""pytest plugin: the CPU seconds of each test phase, for a machine shared with other work, where wall
time (`--durations`) is noisy. `python -m pytest -p hitenter.testing.cpu_durations --cpu-durations=40`
lists the costliest phases; `--cpu-durations-file=F` writes every phase as tab-separated lines
(cpu seconds, wall seconds, phase, node id). CPU is this process's (all threads) plus that of the child
processes it waited for in the phase (servers and CLI runs the tests start and stop); a child still
running when the phase ends is counted in the phase that reaps it."""

from __future__ import annotations

import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

_RECORDS: list[tuple[float, float, str, str]] = []   # (cpu s, wall s, phase, node id)


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cpu-durations")
    group.addoption("--cpu-durations", type=int, default=30, metavar="N",
                    help="list the N test phases that took the most CPU seconds (0: all)")
    group.addoption("--cpu-durations-file", default="", metavar="PATH",
                    help="write every phase's CPU and wall seconds to PATH (tab-separated)")


def _timed(item: pytest.Item, phase: str) -> Generator[None, None, None]:
    cpu, wall = _cpu(), time.perf_counter()
    yield
    _RECORDS.append((_cpu() - cpu, time.perf_counter() - wall, phase, item.nodeid))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    yield from _timed(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    yield from _timed(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    yield from _timed(item, "teardown")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not _RECORDS:
        return
    path = config.getoption("cpu_durations_file")
    if path:
        Path(path).write_text("".join(f"{c:.3f}\t{w:.3f}\t{p}\t{n}\n" for c, w, p, n in _RECORDS))
    n = config.getoption("cpu_durations")
    ranked = sorted(_RECORDS, reverse=True)
    total_cpu, total_wall = sum(r[0] for r in _RECORDS), sum(r[1] for r in _RECORDS)
    terminalreporter.write_sep("=", f"slowest {n or len(ranked)} phases by CPU seconds "
                                    f"(all phases: {total_cpu:.1f} s CPU, {total_wall:.1f} s wall)")
    for cpu, wall, phase, nodeid in ranked[:n or None]:
        terminalreporter.write_line(f"{cpu:8.2f}s cpu {wall:8.2f}s wall  {phase:8} {nodeid}")
