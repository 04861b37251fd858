"""`collector_paused()`: the cyclic garbage collector off while the heavy modules (torch, the engine) are
imported, then what the import made moved out of the collector's sight (`gc.freeze`) and the collector back
on as it was.

An import of torch makes hundreds of thousands of long-lived objects (modules, classes, functions); with
the collector on, each full collection it triggers on the way walks all of them again (a growing series of
walks, about 0.3 s of CPU for `from hitenter.llm import LLM`). Paused, nothing is walked, and frozen, later
collections skip them as well. The import's own garbage (a few reference cycles) is kept, once per process:
only an import that loads the modules pauses and freezes, a repeated one (the modules already in
`sys.modules`) changes nothing.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused(module: str) -> Iterator[None]:
    """Around the first import of `module` (a no-op when it is already imported)."""
    if module in sys.modules:
        yield
        return
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()
