"""``hitenter serve`` in a subprocess for tests and benchmarks: started, waited for, stopped."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from hitenter import envs
from hitenter.testing.net import free_port

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def serve_subprocess(args: Sequence[str], startup_s: float = 120) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``python -m hitenter.cli serve --host 127.0.0.1 --port P *args``; yield (url, process) once
    /health answers 200. Its output goes to a temporary file (a pipe nobody reads would fill up with
    access-log lines and block the server), shown if it exits early."""
    port = free_port()
    env = envs.child_env(pythonpath_first=str(REPO))
    cmd = [sys.executable, "-m", "hitenter.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                out = log.read().decode(errors="replace")
                raise RuntimeError(f"hitenter serve exited with {proc.returncode}:\n{out}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("hitenter serve did not come up")
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
