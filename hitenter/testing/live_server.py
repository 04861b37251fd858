"""A live uvicorn server in a thread on a free 127.0.0.1 port, and the checks the server tests share
(an error body in vLLM's shape, waiting for a condition)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from hitenter.server.http import uvicorn_config
from hitenter.testing.net import free_port

__all__ = ["LiveServer", "assert_error", "free_port", "live_server", "wait_until"]


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    """``r`` is an error with this status in vLLM's shape (and this ``param`` when given); its body."""
    assert r.status_code == status, r.text
    e: dict[str, Any] = r.json()["error"]
    assert set(e) >= {"message", "type", "param", "code"} and e["code"] == status and e["message"]
    if param is not None:
        assert e["param"] == param, e
    return e


class LiveServer:
    def __init__(self, app: Any, header_timeout: float = 10.0) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(app, "127.0.0.1", self.port, header_timeout, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=3)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@contextmanager
def live_server(app: Any, header_timeout: float = 10.0) -> Iterator[LiveServer]:
    srv = LiveServer(app, header_timeout).start()
    try:
        yield srv
    finally:
        srv.stop()


def wait_until(pred: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())
