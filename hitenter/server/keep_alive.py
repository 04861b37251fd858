"""Ollama's ``keep_alive``: how long a model stays loaded after its last request.

- a number: seconds (a negative one: forever);
- a string: a Go duration (``"5m"``, ``"30s"``, ``"1h30m"``, ``"1.5h"``, ``"500ms"``, ``"0"``; units
  ns, us, µs, ms, s, m, h; a negative one: forever), as Ollama's server parses it. The server's
  ``--keep-alive`` flag also takes a bare number of seconds (``"300"``), as ``OLLAMA_KEEP_ALIVE`` does.

``parse_keep_alive`` returns seconds, or None for forever; anything else is a ValueError naming it.
"""

from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_TERM = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
FOREVER = None


def go_duration(text: str) -> float:
    """Seconds of a Go duration string (time.ParseDuration's grammar); ValueError when it is not one."""
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    body = s[1:] if s[:1] in "+-" else s
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total, at = 0.0, 0
    while at < len(body):
        m = _TERM.match(body, at)
        if m is None:
            raise ValueError(f"invalid duration {text!r}: use a number and a unit (ns, us, ms, s, m, h), "
                             "e.g. '5m' or '30s'")
        total += float(m[1]) * _UNITS[m[2]]
        at = m.end()
    return sign * total


def parse_keep_alive(value: float | int | str | None, bare_seconds: bool = False) -> float | None:
    """Seconds a model stays loaded after its last request (None: forever). ``bare_seconds``: a string
    may also be a plain number of seconds (the command-line flag)."""
    if value is None:
        raise ValueError("keep_alive: missing")
    if isinstance(value, bool):
        raise ValueError("keep_alive: a number of seconds or a duration such as '5m', not a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif bare_seconds and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)\s*", value):
        seconds = float(value)
    else:
        seconds = go_duration(value)
    if math.isnan(seconds):
        raise ValueError("keep_alive: not a number")
    return FOREVER if seconds < 0 or math.isinf(seconds) else seconds
