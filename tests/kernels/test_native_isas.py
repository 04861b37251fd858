"""Every C library compiles for the CPUs it may meet, not just this one: AVX-512 with VNNI and BF16
(Ice Lake / Sapphire Rapids servers, Zen 4), AVX-512 without VNNI (Skylake-SP), AVX2 + FMA (Haswell,
Zen 2/3) and plain x86-64, with each variant's own flags (qmatmul's forced ISAs, the attention kernels'
portable instance). `-fsyntax-only`, so no code is generated (~60 compiles, 2 at a time: ~20 s CPU, so slow). Found the AVX2
branch of the repacked Q8_0 GEMM guarded by a C `if` instead of `#if`, which only an AVX-512-VNNI build
rejects (this machine is AVX2: its builds never saw it)."""

from __future__ import annotations

import platform
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from hitenter.kernels.build import find_compiler
from hitenter.kernels.native import LIBRARIES

MARCHES = ["sapphirerapids", "icelake-server", "skylake-avx512", "haswell", "x86-64"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or find_compiler() is None,
                                 reason="x86-64 with a C compiler only")]


def known(march: str) -> bool:
    """Whether this compiler knows -march=march (an older GCC may not know sapphirerapids)."""
    r = subprocess.run([find_compiler(), f"-march={march}", "-E", "-x", "c", "-"], input="", capture_output=True,
                       text=True, timeout=60)
    return r.returncode == 0


def builds() -> list[tuple[str, str, list[str]]]:
    """(id, source, flags) per library, variant and instance, at every -march this compiler knows."""
    out = []
    marches = [m for m in MARCHES if known(m)]
    assert "x86-64" in marches
    for lib in LIBRARIES:
        extra = [("", [])] + [(f"{k}:", v) for k, v in (lib.variants or {}).items()] \
            + [(f"{k}:", v) for k, v in (lib.instances or {}).items()]
        for march in marches:
            for tag, flags in extra:
                out.append((f"{lib.name}:{tag}{march}", str(lib.source), [f"-march={march}", *lib.flags, *flags]))
    return out


def test_every_library_compiles_for_every_isa() -> None:
    cc = find_compiler()

    def check(build: tuple[str, str, list[str]]) -> str | None:
        name, source, flags = build
        r = subprocess.run([cc, "-fsyntax-only", "-fopenmp", *flags, source], capture_output=True, text=True,
                           timeout=300)
        errors = [ln for ln in r.stderr.splitlines() if "error" in ln][:3]
        return f"{name}: {errors}" if r.returncode else None

    with ThreadPoolExecutor(2) as pool:
        failures = [f for f in pool.map(check, builds()) if f]
    assert not failures, "\n".join(failures)
