"""How OpenMP threads wait between parallel regions, set before the OpenMP runtime loads.

libgomp's default is to spin ~300,000 times before sleeping. On a CPU shared with other work that is the
worst case: a step's threads spin at each barrier for a thread the OS has descheduled, and batch-1 decode
collapses, most of its CPU time going to libgomp spinning (figures: docs/benchmarks.md). A short spin
keeps the quick hand-offs between a step's regions and sleeps when a thread does not come.

`GOMP_SPINCOUNT` is read once, when libgomp loads (with torch, or the first native kernel), so
``hitenter/__init__.py`` calls :func:`configure` before anything imports torch. An explicit
``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` in the environment wins.
"""

from __future__ import annotations

from hitenter import envs

SPIN_COUNT = "1000"


def configure(environ: dict[str, str] | None = None) -> None:
    """Set GOMP_SPINCOUNT to SPIN_COUNT unless the user chose a wait policy or spin count."""
    envs.set_unless(envs.GOMP_SPINCOUNT, SPIN_COUNT, (envs.GOMP_SPINCOUNT, envs.OMP_WAIT_POLICY), environ)
