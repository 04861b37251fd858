"""uvicorn settings for the server: h11 with a deadline for reading a request's headers.

uvicorn arms its keep-alive timer only after a response, and any byte received cancels it, so a
client that opens a connection and never finishes its headers (one line every few seconds) held it
forever. ``GuardedH11Protocol`` gives every request ``header_timeout`` seconds from its first byte
(or from the connection's start) to complete its headers, then answers 408 and closes. Header size
is bounded by h11 (``h11_max_incomplete_event_size``, 16 KiB by default) and keep-alive idling by
``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT = 10.0
_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s")
_408_BODY = (b'{"error":{"message":"request headers not received in time","type":"RequestTimeoutError",'
             b'"param":null,"code":408}}')


class GuardedH11Protocol(H11Protocol):
    header_timeout: float = DEFAULT_HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:         # bytes of a new request's head
            self._arm()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:     # its headers are complete
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is not h11.IDLE:     # a pipelined request already read on
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(_408 % (len(_408_BODY), _408_BODY))
            self.transport.close()


def uvicorn_config(app: Any, host: str = "127.0.0.1", port: int = 8000,
                   header_timeout: float = DEFAULT_HEADER_TIMEOUT, **kwargs: Any) -> uvicorn.Config:
    protocol = type("HeaderTimeoutH11", (GuardedH11Protocol,), {"header_timeout": header_timeout})
    kwargs.setdefault("timeout_keep_alive", 5)
    kwargs.setdefault("timeout_graceful_shutdown", 5)
    return uvicorn.Config(app, host=host, port=port, http=protocol, **kwargs)
