"""One request field's value against the process's limits (body_limits.LIMITS), as the routes call them:
a value over a limit is the server's ``APIError`` (400, or 413 for a grammar input over its size), naming
the field and the ``hitenter serve`` flag that sets the limit."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, NoReturn, TypeVar

from hitenter.server import body_limits
from hitenter.server.api_error import APIError
from hitenter.server.body_limits import Refusal

T = TypeVar("T")


def _raise(r: Refusal) -> NoReturn:
    raise APIError(r.status, r.message, r.param) from None


def _raising(check: Callable[..., T]) -> Callable[..., T]:
    """``check`` against the process's LIMITS, its Refusal raised as the server's APIError."""
    @wraps(check)
    def run(*args: Any) -> T:
        try:
            return check(*args, body_limits.LIMITS)
        except Refusal as r:
            _raise(r)
    return run


check_schema = _raising(body_limits.check_schema_within)     # (schema, field)
check_choices = _raising(body_limits.check_choices_within)   # (choices, field)
check_text = _raising(body_limits.check_text_within)         # (text, kind, field)


def loads(text: str, field: str, what: str = "not valid JSON") -> Any:
    """``json.loads`` of a string field, bounded: too deep for the parser or over ``max_json_depth`` is a 400."""
    try:
        return body_limits.loads_within(text, field, body_limits.LIMITS, what)
    except Refusal as r:
        _raise(r)
