"""Reading calls written as JSON objects (``{"name": ..., "arguments" | "parameters": {...}}``), shared
by the formats that write them so (Hermes, Llama 3, Granite, Mistral's older list form)."""

from __future__ import annotations

import json
import re
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, json_object

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


_DEC = json.JSONDecoder()
_WS = " \t\r\n"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _members(text: str, i: int) -> tuple[list[tuple[str, Any]], int | None, bool]:
    """The members of the JSON object opening at ``text[i]`` that are certain (each value followed by
    ``,`` or ``}``: a number may still grow), where the object ends (None: not yet), and whether the
    text read so far is well formed."""
    pairs: list[tuple[str, Any]] = []
    i = _skip(text, i + 1)
    while i < len(text):
        if text[i] == "}" and not pairs:
            return pairs, i + 1, True
        if text[i] != '"':
            return pairs, None, False
        try:
            key, j = _DEC.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError) as e:
            return pairs, None, _unfinished(e, text)
        j = _skip(text, j)
        if j >= len(text) or text[j] != ":":
            return pairs, None, j >= len(text)
        k = _skip(text, j + 1)
        try:
            value, k = _DEC.raw_decode(text, k)
        except (json.JSONDecodeError, RecursionError) as e:
            return pairs, None, k >= len(text) or _unfinished(e, text)
        k = _skip(text, k)
        if k >= len(text):
            return pairs, None, True
        if text[k] not in ",}" or any(key == p for p, _ in pairs):
            return pairs, None, False
        pairs.append((key, value))
        if text[k] == "}":
            return pairs, k + 1, True
        i = _skip(text, k + 1)
    return pairs, None, True


def _unfinished(e: Exception, text: str) -> bool:
    """Whether a JSON error is the text ending early (a value still being written), not a wrong character."""
    return isinstance(e, json.JSONDecodeError) and (e.msg.startswith("Unterminated") or e.pos >= len(text))


def stream_call(block: str) -> tuple[str | None, str]:
    """(name, the arguments' certain prefix) of a ``{"name": ..., "arguments": {...}}`` call still being
    written: nothing until the name (first) is complete and the arguments object has begun, well formed
    so far; then the object's complete members in ``json.dumps``'s form, so the prefix grows into the
    parsed call's arguments. A block that goes wrong before that stays text."""
    text = block.lstrip()
    if not text.startswith("{"):
        return None, ""
    top, _, ok = _members(text, 0)
    if not ok or not top or top[0][0] != "name" or not isinstance(top[0][1], str):
        return None, ""
    m = re.match(r'\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"(arguments|parameters)"\s*:\s*', text)
    if m is None or not text[m.end():].startswith("{"):
        return None, ""
    first = _skip(text, m.end() + 1)
    if first >= len(text) or text[first] not in '"}':      # not yet a member nor the end: undecided
        return None, ""
    pairs, _, ok = _members(text, m.end())
    return (top[0][1], json_object(pairs, closed=False)) if ok else (None, "")
