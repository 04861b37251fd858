"""Reading calls written as JSON objects (``{"name": ..., "arguments" | "parameters": {...}}``), shared
by the formats that write them so (Hermes, Llama 3, Granite, Mistral's older list form)."""

from __future__ import annotations

import json
import re
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def as_call(obj: Any, names: set[str] | None = None) -> ParsedCall | None:
    """(name, arguments JSON) of one call object; None when it is not one (or names a function not in
    ``names``)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None


def json_values(text: str, seps: str = ";\n ") -> list[Any] | None:
    """The JSON values of ``text`` one after another (separated by any of ``seps``); None if any part
    is not JSON."""
    dec, out, i, n = json.JSONDecoder(), [], 0, len(text)
    while True:
        while i < n and text[i] in seps:
            i += 1
        if i >= n:
            return out
        try:
            value, i = dec.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):
            return None
        out.append(value)


def calls_of(values: list[Any] | None, names: set[str] | None = None) -> list[ParsedCall] | None:
    """Calls of a list of values (a value that is a list is a list of calls); None unless all are calls."""
    if not values:
        return None
    flat = [v for x in values for v in (x if isinstance(x, list) else [x])]
    calls = [as_call(v, names) for v in flat]
    return None if not calls or any(c is None for c in calls) else calls  # type: ignore[return-value]


def unfence(text: str) -> str:
    return _FENCE.sub("", text.strip()).strip()
