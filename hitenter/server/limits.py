"""Bounded work for every request (issue 32): depth and size limits on nested input, checked without
recursion before anything recurses (pydantic, templates, xgrammar), and the size limits on the inputs
that drive grammar compilation. Each refusal is an ``APIError`` naming the field and the limit (400;
413 for a grammar input over its size limit), rendered in the API's own error shape. The checks
themselves are hitenter/server/limit_checks.py (light: the body-check worker runs them too).

- ``BoundedBodyMiddleware``: the whole request body, before FastAPI parses it (``check_body``): no value
  nested deeper than ``max_json_depth`` below its top-level field; at most ``max_stop`` stop strings,
  ``max_logit_bias`` logit_bias entries, ``max_tools`` tools and ``max_messages`` messages/items; the
  grammar inputs within their sizes. Bodies over 64 KiB are checked in a worker process (body_check.py).
- ``loads`` / ``check_json``: a JSON value parsed from a string (a ``guided_json`` string, tool-call arguments).
- ``check_schema``: a JSON schema before it is compiled: depth, nodes, ``enum`` sizes, ``pattern`` lengths.
- ``check_choices`` / ``check_text``: ``guided_choice`` and regex / EBNF sources.

The limits are flags of ``hitenter serve`` (hitenter/cli.py); ``LIMITS`` holds the process's values
(``create_app(limits=...)`` sets them)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hitenter.server import limit_checks as C
from hitenter.server.api_error import APIError
from hitenter.server.limit_checks import Limits, deep_field, depth_over

__all__ = ["LIMITS", "Limits", "BoundedBodyMiddleware", "configure", "loads", "check_json", "check_body",
           "check_schema", "check_choices", "check_text", "deep_field", "depth_over", "api_error"]

LIMITS = Limits()
T = TypeVar("T")


def configure(limits: Limits) -> None:
    """Set the process's limits (the grammar backend's time and cache bounds too)."""
    global LIMITS
    LIMITS = limits
    from hitenter.engine import structured
    structured.configure(limits.max_grammar_compile_seconds, limits.max_grammar_cache_bytes)


def api_error(r: C.Refusal) -> APIError:
    return APIError(r.status, r.message, r.param)


def _raising(check: Callable[..., T]) -> Callable[..., T]:
    """``check`` against the process's LIMITS, its Refusal raised as an APIError."""
    @wraps(check)
    def run(*args: Any) -> T:
        try:
            return check(*args, LIMITS)
        except C.Refusal as r:
            raise api_error(r) from None
    return run


check_body = _raising(C.check_body)         # (body)
check_schema = _raising(C.check_schema)     # (schema, field)
check_choices = _raising(C.check_choices)   # (choices, field)
check_text = _raising(C.check_text)         # (text, kind, field)


def loads(text: str, field: str, what: str = "not valid JSON") -> Any:
    """``json.loads`` of a string field, bounded: too deep for the parser or over ``max_json_depth`` is a 400."""
    try:
        return C.loads(text, field, LIMITS, what)
    except C.Refusal as r:
        raise api_error(r) from None


def check_json(value: Any, field: str, limit: int | None = None) -> None:
    try:
        C.check_json(value, field, LIMITS.max_json_depth if limit is None else limit)
    except C.Refusal as r:
        raise api_error(r) from None


def body_problem(body: bytes) -> APIError | None:
    """The raw body's problem against the process's LIMITS (None also for malformed JSON: the app's 400)."""
    r = C.body_problem(body, LIMITS)
    return None if r is None else api_error(r)


class BoundedBodyMiddleware:
    """``check_body`` on the JSON body of every POST under ``prefixes``, before the app parses it: the body
    is read (its size is already bounded by BodyLimitMiddleware, outside this one), parsed once here,
    checked, and replayed to the app. A body too deep for the JSON parser itself is refused naming its
    field, as is one over the limits; the error is in the API's own shape (by path). Bodies over 64 KiB
    are parsed and checked in a worker process (hitenter/server/body_check.py: the parse holds the GIL)."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...]) -> None:
        from hitenter.server import body_check  # it imports this module
        self.app, self.prefixes, self.check = app, prefixes, body_check.problem
        body_check.CHECKER.warm()

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
        problem = await self.check(body, (scope.get("client") or ("",))[0])
        if problem is not None:
            await problem.response(path)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
