"""hitenter/omp_wait.py: a short OpenMP spin by default, set before libgomp loads; the user's choice wins."""

from __future__ import annotations

import os
import subprocess
import sys

from hitenter import omp_wait

SHOW = "import hitenter, os, sys; print(os.environ.get('GOMP_SPINCOUNT')); print('torch' in sys.modules)"


def run(env: dict[str, str]) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", SHOW], env={**base, **env}, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_import_sets_a_short_spin_before_torch_loads() -> None:
    assert run({}) == [omp_wait.SPIN_COUNT, "False"]


def test_the_users_setting_wins() -> None:
    assert run({"GOMP_SPINCOUNT": "7"})[0] == "7"
    assert run({"OMP_WAIT_POLICY": "ACTIVE"})[0] == "None"


def test_configure_on_a_mapping() -> None:
    env: dict[str, str] = {}
    omp_wait.configure(env)
    assert env == {"GOMP_SPINCOUNT": omp_wait.SPIN_COUNT}
