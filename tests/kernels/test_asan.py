"""The native kernels' tests under AddressSanitizer: every C library is rebuilt with
-fsanitize=address (through a CC wrapper: hitenter/kernels/build.py reads CC, and the compiler's path
is part of each build's cache key, so these builds never replace the ordinary ones) and tests/kernels runs in
a child process with libasan preloaded. Any out-of-bounds read or write, use after free or double free in
a kernel stops that process with ASan's report, which this test shows. Leak checking is off (CPython
leaks by design at exit)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hitenter import envs
from hitenter.paths import hitenter_home
from hitenter.testing.paths import REPO

ASAN_FLAGS = "-O1 -g -fsanitize=address -fno-omit-frame-pointer"


def libasan() -> str | None:
    """The path of gcc's libasan.so, or None where gcc or the library is absent."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    out = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return out if out and Path(out).is_absolute() and Path(out).exists() else None


def asan_compiler() -> Path:
    """A stable CC wrapper adding ASAN_FLAGS (its file name carries the flags' version, so a change of
    flags is a new cache key)."""
    cc = hitenter_home() / "kernels" / "asan-cc-v1"
    text = f'#!/bin/sh\nexec {shutil.which("gcc")} "$@" {ASAN_FLAGS}\n'
    if not cc.exists() or cc.read_text() != text:
        cc.parent.mkdir(parents=True, exist_ok=True)
        cc.write_text(text)
        cc.chmod(0o755)
    return cc


@pytest.mark.slow
def test_kernels_run_clean_under_address_sanitizer(tmp_path: Path) -> None:
    lib = libasan()
    if lib is None:
        pytest.skip("no libasan: gcc -print-file-name=libasan.so does not name an existing library")
    env = envs.child_env(str(REPO))
    env.update(CC=str(asan_compiler()), LD_PRELOAD=lib,
               ASAN_OPTIONS=f"detect_leaks=0:halt_on_error=1:exitcode=99:log_path={tmp_path / 'asan'}")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                        "-m", "not slow", "tests/kernels", "--deselect", "tests/kernels/test_asan.py"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=2400)
    reports = sorted(tmp_path.glob("asan*"))
    report = reports[0].read_text()[:6000] if reports else ""
    assert not reports, f"AddressSanitizer found an error:\n{report}"
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
