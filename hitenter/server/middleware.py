"""The middleware around every route, outermost last as api.create_app adds them:

- ``CatchAllMiddleware``: a bug in a route becomes a 500 in the API's error shape without dropping the
  connection.
- Request framing guards before any parsing (``BodyLimitMiddleware``): the body size limit (413; a body
  without Content-Length is counted as it streams; the rest of an oversized body is drained up to
  ``DRAIN_CAP`` bytes so the client gets the 413, then the connection closes) and ambiguous framing
  (Content-Length with Transfer-Encoding, or two Content-Lengths: request smuggling bait; 400, close);
  then ``BoundedBodyMiddleware``: the depth and size bounds of hitenter/server/body_limits.py on every
  API body.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hitenter.server import body_limits
from hitenter.server.api_error import APIError, internal_message

log = logging.getLogger("hitenter.server")


class CatchAllMiddleware:
    """A bug in a route becomes a 500 in our shape and the connection stays usable. (Starlette's
    ServerErrorMiddleware re-raises after answering, and uvicorn then closes the keep-alive
    connection: the client's next request on it was reset.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as e:
            log.exception("internal error")
            if not started:
                await APIError(500, internal_message(e)).response(scope["path"])(scope, receive, send)


DEFAULT_MAX_BODY_BYTES = 32 << 20   # room for a base64 image at the images limit (20 MiB raw, ~27 MiB encoded)


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


class BoundedBodyMiddleware:
    """The bounds of hitenter/server/body_limits.py on the JSON body of every POST under ``prefixes``,
    before the app parses it: the body is read (its size is already bounded by BodyLimitMiddleware,
    outside this one), checked (bodies over 64 KiB in the body-check worker process: the parse holds the
    GIL), and replayed to the app. A body too deep for the JSON parser itself is refused naming its field,
    as is one over the limits; the error is in the API's own shape (by path)."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...]) -> None:
        self.app, self.prefixes = app, prefixes
        body_limits.CHECKER.warm()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        try:
            while more:
                msg = await receive()
                if msg["type"] != "http.request":
                    return                              # the client left
                chunks.append(msg.get("body", b""))
                more = msg.get("more_body", False)
        except HTTPException as e:                      # the body limit (413), raised from its receive
            await APIError(e.status_code, str(e.detail), headers=dict(e.headers or {})).response(path)(
                scope, receive, send)
            return
        body = b"".join(chunks)
        r = await body_limits.problem(body, (scope.get("client") or ("",))[0])
        if r is not None:
            await APIError(r.status, r.message, r.param).response(path)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
