"""Build-on-first-use for the native C libraries (declared and loaded in hitenter/kernels/native.py).

`cc -O3 -march=native -fopenmp -shared` into $HITENTER_HOME/kernels (~/.cache/hitenter/kernels), the
file name keyed by the sources, the compiler, the flags and this CPU's flags (a cache shared by
machines with different CPUs never hands one the other's binary). Built under a temporary name and
renamed into place, so concurrent processes never load a half-written file. Seconds, once per machine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hitenter import envs
from hitenter.paths import hitenter_home

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
    return envs.CC.get() or shutil.which("cc") or shutil.which("gcc")


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
        run_compiler([cc, *all_flags, "-o", tmp, str(main_source), "-lm"])
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError) as e:
        detail = (getattr(e, "stderr", b"") or b"").decode(errors="replace")[-800:]
        raise BuildError(f"building {name} with {cc} failed: {str(e).rstrip('.')}. {detail}".rstrip()) from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def run_compiler(cmd: list[str], timeout: float = 300) -> None:
    """Run the compiler in its own process group, so a timeout stops the whole of it (cc1 too, not only
    the driver). CalledProcessError / TimeoutExpired as subprocess.run(check=True) raises them."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            os.killpg(proc.pid, signal.SIGKILL)
            e.stderr = proc.communicate()[1]
            raise
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stdout, stderr)
