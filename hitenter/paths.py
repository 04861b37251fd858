"""Where hitenter keeps its files: ``hitenter_home()``, with known models under ``models/``
(hitenter/models/registry.py) and compiled kernels under ``kernels/`` (hitenter/kernels/build.py)."""

from __future__ import annotations

import os
from pathlib import Path


def hitenter_home() -> Path:
    """`$HITENTER_HOME` (with `~` expanded) or `~/.cache/hitenter`. Not created here."""
    env = os.environ.get("HITENTER_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hitenter"
