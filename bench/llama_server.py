"""Start and stop llama.cpp's native ``llama-server`` for a benchmark (see bench/build_llama_server.sh).

    with LlamaServer(binary, gguf, parallel=8, ctx_per_slot=512) as srv:
        ...  # OpenAI-compatible API at srv.url

The process is terminated (then killed if it does not exit) on leaving the block, also on exceptions
and KeyboardInterrupt; on Linux it is also sent SIGTERM if this Python process dies. Its output goes
to a temporary log whose tail is shown when it fails to come up.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from hitenter.testing.net import free_port


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class ServerProcess:
    """A server in its own process (`command()`), healthy on /health; stopped on leaving the block."""

    name = "server"

    def __init__(self, startup_timeout: float = 120.0) -> None:
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> ServerProcess:
        self._log = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log", delete=False)
        cmd = self.command()
        print("starting: " + " ".join(cmd), file=sys.stderr, flush=True)
        try:   # llama-server with its own OpenMP defaults, not the spin count hitenter set (bench/common.py)
            from common import baseline_env
            env: dict[str, str] | None = baseline_env()
        except ImportError:
            env = None
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent, env=env)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} before it was "
                                   f"ready; log tail:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2.0)
                if r.status_code == 200:
                    print(f"{self.name} ready on {self.url} in {time.monotonic() - t0:.1f} s",
                          file=sys.stderr, flush=True)
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} did not report healthy on {self.url}/health within "
                           f"{self.startup_timeout:g} s (last: {last}); log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        lines = Path(self._log.name).read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.terminate()
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"{self.name} did not exit within {timeout:.0f} s of SIGTERM; killing it", file=sys.stderr)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if self._log is not None:
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class LlamaServer(ServerProcess):
    name = "llama-server"

    def __init__(self, binary: str | os.PathLike[str], model: str | os.PathLike[str], *, parallel: int,
                 ctx_per_slot: int, threads: int = 2, threads_batch: int | None = None,
                 startup_timeout: float = 120.0, extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(startup_timeout)
        self.binary = Path(binary).expanduser()
        if not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            raise FileNotFoundError(f"llama-server binary not found or not executable: {self.binary} "
                                    "(build it with bench/build_llama_server.sh)")
        self.model = Path(model).expanduser()
        self.parallel = parallel
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads
        self.threads_batch = threads_batch or threads
        self.extra_args = extra_args

    def command(self) -> list[str]:
        # Explicit --parallel gives each slot its own c / parallel cells (no unified KV pool);
        # continuous batching is llama-server's default, --cont-batching just makes it explicit.
        return [str(self.binary), "-m", str(self.model), "--parallel", str(self.parallel),
                "-c", str(self.parallel * self.ctx_per_slot), "--cont-batching",
                "-t", str(self.threads), "-tb", str(self.threads_batch),
                "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args]
