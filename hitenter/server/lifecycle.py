"""The options of a server's model lifecycle (``Lifecycle``; hitenter/server/model_manager.py applies
them): how long an idle model stays, how many models and bytes of them may be loaded at once, how long a
load waits for models in use. Standard library only: the command line checks them before anything loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Lifecycle:
    keep_alive: float | None = 300.0          # seconds an idle model loaded on demand stays; None: forever
    max_loaded_models: int = 3                # Ollama's default on a CPU
    max_loaded_memory: int | None = None      # bytes of resident models; None: 3/4 of physical memory
    wait_seconds: float = 120.0               # how long a load waits for models in use to become idle

    def __post_init__(self) -> None:
        if self.max_loaded_models < 1:
            raise ValueError("max_loaded_models: at least 1")
        if self.max_loaded_memory is not None and self.max_loaded_memory < 1:
            raise ValueError("max_loaded_memory: a positive number of bytes")
        if self.keep_alive is not None and self.keep_alive < 0:
            raise ValueError("keep_alive: seconds >= 0, or None for forever")

    def memory_limit(self) -> int:
        if self.max_loaded_memory is not None:
            return self.max_loaded_memory
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4
        except (ValueError, OSError, AttributeError):
            return 6 << 30
