"""Which forced qmatmul builds (HITENTER_QMATMUL_ISA) are the default build in other words, on this CPU.

The default build is `-march=native`; the forced `avx2` build adds `-mno-avx512f`. On an x86 CPU with AVX2
and without AVX-512F that flag changes nothing: the two compile to the same binary (the same bytes, as cmp
shows), so a test that forces `avx2` there repeats the default build's tests at the cost of one more
qmatmul compile (the slowest of the native builds but one). Such tests stay in the full suite (`slow`) and leave the
fast lane; on an AVX-512 CPU, where `avx2` is other code, they stay fast."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest


@cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def default_build_is_avx2() -> bool:
    """The default qmatmul build is the `avx2` build here: AVX2 without AVX-512F."""
    flags = cpu_flags()
    return "avx2" in flags and "avx512f" not in flags


def forced_isa_params(isas: list[str]) -> list[object]:
    """`isas` as pytest parameters, `avx2` marked slow where it is the default build (see the module doc)."""
    return [pytest.param(isa, marks=pytest.mark.slow if isa == "avx2" and default_build_is_avx2() else ())
            for isa in isas]
