"""Build-on-first-use for the native C libraries (qmatmul, the decode attention kernel).

`cc -O3 -march=native -fopenmp -shared` into $HITENTER_HOME/kernels (~/.cache/hitenter/kernels), the
file name keyed by the sources, the compiler, the flags and this CPU's flags (a cache shared by
machines with different CPUs never hands one the other's binary). Built under a temporary name and
renamed into place, so concurrent processes never load a half-written file. Seconds, once per machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from hitenter.models.registry import hitenter_home

BASE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


class BuildError(RuntimeError):
    """No compiler, or the compiler failed (the message carries the tail of its output)."""


def cpu_key() -> str:
    """Short hash of this CPU's feature flags (/proc/cpuinfo), part of every cache key."""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return hashlib.sha256(flags.encode()).hexdigest()[:12]


def find_compiler() -> str | None:
    """$CC, else cc or gcc on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build_library(name: str, main_source: Path, flags: Sequence[str], extra_sources: Sequence[Path] = ()) -> Path:
    """Path of the compiled `main_source` (which may #include `extra_sources`), building it if needed."""
    cc = find_compiler()
    if cc is None:
        raise BuildError("no C compiler found (set CC, or install cc/gcc)")
    all_flags = [*BASE_FLAGS, *flags]
    h = hashlib.sha256()
    for src in (main_source, *extra_sources):
        h.update(src.read_bytes())
    h.update(" ".join([cc, *all_flags, cpu_key()]).encode())
    out = hitenter_home() / "kernels" / f"{name}-{h.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *all_flags, "-o", tmp, str(main_source), "-lm"], check=True, capture_output=True,
                       timeout=300)
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError) as e:
        detail = (getattr(e, "stderr", b"") or b"").decode(errors="replace")[-800:]
        raise BuildError(f"building {name} with {cc} failed: {e}. {detail}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load_library(name: str, main_source: Path, flags: Sequence[str], extra_sources: Sequence[Path] = ()) -> ctypes.CDLL:
    """Build if needed, then dlopen. Raises BuildError (also for a library that fails to load)."""
    path = build_library(name, main_source, flags, extra_sources)
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise BuildError(f"loading {path} failed: {e}") from e


class LazyLibrary:
    """A kernel library built and loaded on the first call, once per process: ``lib()`` returns the
    CDLL (after ``setup(lib)`` declared its functions), or None when the environment switch ``env`` is
    "0" or the build fails (logged once: "<what> unavailable: <fallback>")."""

    def __init__(self, name: str, source: Path, extra: Sequence[Path], env: str, what: str, fallback: str,
                 setup: Callable[[ctypes.CDLL], None]) -> None:
        self.name, self.source, self.extra, self.env = name, source, list(extra), env
        self.what, self.fallback, self.setup = what, fallback, setup
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._tried = False

    def __call__(self) -> ctypes.CDLL | None:
        if self._lib is not None:      # loaded: no lock (this runs per layer per step)
            return self._lib
        with self._lock:
            if self._tried:
                return self._lib
            self._tried = True
            if os.environ.get(self.env, "1") == "0":
                return None
            try:
                lib = load_library(self.name, self.source, [], self.extra)
            except BuildError as e:
                logging.getLogger("hitenter.kernels").warning("%s unavailable: %s. %s", self.what, self.fallback, e)
                return None
            self.setup(lib)
            self._lib = lib
            return lib
