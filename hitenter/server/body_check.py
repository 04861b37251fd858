"""Large request bodies are checked (``limit_checks.body_problem``) in a worker process, not in the server's.

Why: ``json.loads`` is one C call that holds the GIL for its whole length, 17-26 ms for a 1 MB list of
100k strings (measured here), and the GIL is what the engine thread and the event loop need to keep
decoding and streaming. A client looping refused 1 MB grammars (issue 32) held it about half the time
and 16 streams kept 0.43x their tokens/s. The worker (one, started when the app first runs, at
``limit_checks.WORKER_NICE`` below the server's CPU priority, in its own session so a terminal's Ctrl-C
is the server's alone; it imports neither FastAPI nor torch) parses and checks; the server only writes
the bytes down a pipe (GIL released) from one helper thread and reads a one-line verdict. The app still
parses the bodies that pass, itself, as before.

- ``problem(body)``: the body's ``APIError`` or None; bodies up to ``INLINE_BYTES`` are checked in place
  (well under a millisecond), larger ones in the worker. At most ``MAX_PENDING`` large bodies wait for
  it at once; one more is a 429 (Retry-After). A worker that dies (or is silent ``STUCK_S`` on one
  body) is started again on the next body, and the body it failed on is checked in the helper thread
  instead (never a 5xx).
- A client (by address) whose large bodies keep being refused (more than ``PACE_FREE`` in
  ``PACE_WINDOW_S``) gets each further refusal ``PACE_DELAY_S`` late: one client looping refused 1 MB
  grammars then costs the server a few refusals a second, not dozens (each is still ~4 ms of the
  server's interpreter receiving the body); its answers stay the same 4xx, within a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from hitenter.server import limits
from hitenter.server.api_error import APIError
from hitenter.server.limit_checks import HEAD

INLINE_BYTES = 1 << 16
MAX_PENDING = 16
STUCK_S = 30.0                        # a worker silent this long on one body is replaced
PACE_FREE, PACE_WINDOW_S, PACE_DELAY_S = 8, 10.0, 0.5
_PACE_CLIENTS = 4096                  # addresses remembered, least recently refused out
_WORKER = "from hitenter.server.limit_checks import serve; serve()"
_SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BodyChecker:
    """One worker process and the helper thread that talks to it (see the module's docstring)."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="body-check")
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.pending = 0

    def warm(self) -> None:
        """Start the worker now (in the helper thread), so the first large body does not wait for it."""
        self._thread.submit(self._worker)

    async def problem(self, body: bytes) -> APIError | None:
        if len(body) <= INLINE_BYTES:
            return limits.body_problem(body)
        if self.pending >= MAX_PENDING:
            return APIError(429, f"too many large request bodies ({MAX_PENDING}) are being checked; retry",
                            headers={"Retry-After": "1"})
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, self._check, body)
        finally:
            self.pending -= 1

    @property
    def worker_pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _worker(self) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
                self._proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, env=env, start_new_session=True)
            return self._proc

    def _check(self, body: bytes) -> APIError | None:
        lim = json.dumps(asdict(limits.LIMITS)).encode()
        try:
            proc = self._worker()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(HEAD.pack(len(lim), len(body)) + lim)
            proc.stdin.write(body)
            proc.stdin.flush()
            if not select.select([proc.stdout], [], [], STUCK_S)[0]:
                raise OSError("the body-check worker is stuck")
            verdict = json.loads(proc.stdout.readline())
        except (OSError, ValueError):                 # the worker died (killed, out of memory): check it here
            self._stop()
            return limits.body_problem(body)
        return None if verdict is None else APIError(verdict[0], verdict[1], verdict[2])

    def _stop(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.kill()
                self._proc.wait()
                self._proc = None


class RefusalPacer:
    """How late a client's refusal is answered: 0 for its first ``PACE_FREE`` in ``PACE_WINDOW_S``, then
    ``PACE_DELAY_S`` (event-loop state: called from the loop only)."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def delay(self, client: str) -> float:
        now = time.monotonic()
        times = self._seen.pop(client, None) or deque(maxlen=PACE_FREE + 1)
        times.append(now)
        self._seen[client] = times
        while len(self._seen) > _PACE_CLIENTS:
            self._seen.popitem(last=False)
        return PACE_DELAY_S if len(times) > PACE_FREE and now - times[0] < PACE_WINDOW_S else 0.0


CHECKER, PACER = BodyChecker(), RefusalPacer()


async def problem(body: bytes, client: str = "") -> APIError | None:
    """The body's limits problem against the process's LIMITS, large bodies checked in the worker; a
    large body's refusal paced by ``client`` (its address)."""
    err = await CHECKER.problem(body)
    if err is not None and len(body) > INLINE_BYTES:
        delay = PACER.delay(client)
        if delay:
            await asyncio.sleep(delay)
    return err
