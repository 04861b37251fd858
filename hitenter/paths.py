"""Where hitenter keeps its files: ``hitenter_home()``, with known models under ``models/``
(hitenter/models/registry.py) and compiled kernels under ``kernels/`` (hitenter/kernels/build.py)."""

from __future__ import annotations

from pathlib import Path

from hitenter import envs


def hitenter_home() -> Path:
    """`$HITENTER_HOME` (with `~` expanded) or `~/.cache/hitenter`. Not created here."""
    return envs.HITENTER_HOME.get()
