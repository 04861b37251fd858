"""Request framing guards, before any parsing: the body size limit (413) and ambiguous framing (400).

- ``Content-Length`` above the limit is refused before the app runs; a body without one (chunked) is
  counted as it streams and refused as soon as it passes the limit. The rest of an oversized body is
  read and dropped (up to ``DRAIN_CAP`` bytes, in constant memory) so that the client, still sending,
  gets the 413 rather than a connection reset; the connection is then closed.
- ``Content-Length`` together with ``Transfer-Encoding`` (or two ``Content-Length``s) is request
  smuggling bait: h11 would read the body as chunked and the rest as a second request. 400, close.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hitenter.server.api_error import APIError

DEFAULT_MAX_BODY_BYTES = 4 << 20
DRAIN_CAP = 64 << 20
_CLOSE = {"Connection": "close"}


def framing_problem(headers: list[tuple[bytes, bytes]], limit: int) -> APIError | None:
    lengths = [v for k, v in headers if k == b"content-length"]
    chunked = any(k == b"transfer-encoding" for k, _ in headers)
    if lengths and chunked or len(lengths) > 1:
        return APIError(400, "ambiguous framing: send either Content-Length or Transfer-Encoding, once",
                          headers=_CLOSE)
    if not lengths:
        return None
    try:
        n = int(lengths[0])
    except ValueError:
        return APIError(400, "Content-Length is not a number", headers=_CLOSE)
    return too_large(limit) if n > limit else None


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body too large: the limit is {limit} bytes (--max-body-bytes)",
                      headers=_CLOSE)


async def _drain(receive: Receive, seen: int = 0) -> None:
    while seen <= DRAIN_CAP:
        msg = await receive()
        if msg["type"] != "http.request" or not msg.get("more_body", False):
            return
        seen += len(msg.get("body", b""))


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = framing_problem(scope["headers"], self.limit)
        if problem is not None:
            if problem.status == 413:
                await _drain(receive)
            await problem.response(scope["path"])(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.limit:
                    if msg.get("more_body", False):
                        await _drain(receive, received)
                    err = too_large(self.limit)    # raised to the route, answered by the HTTPException handler
                    raise HTTPException(413, err.message, headers=err.headers)
            return msg

        await self.app(scope, counted, send)
