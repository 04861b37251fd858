"""gpt-oss harmony: a ``commentary`` message to ``functions.NAME`` is a call, its body the arguments
(JSON). The harmony reasoning parser (hitenter/server/reasoning/harmony.py) hands such a message on
as ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>``, which the
model itself writes the same way. The name goes out with the header, the arguments as they come;
the call stands as written even when its body is not JSON (the header made it a call)."""

from __future__ import annotations

import re
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser

MESSAGE = "<|message|>"
_NAME = re.compile(r"([^\s<]+)")


class HarmonyToolParser(ToolParser):
    name = "harmony"
    needs_special = True
    open, close = "<|channel|>commentary to=functions.", "<|call|>"
    sep = ""

    def _parts(self, block: str) -> tuple[str, str] | None:
        i = block.find(MESSAGE)
        m = _NAME.match(block)
        if i < 0 or m is None:
            return None
        return m.group(1), block[i + len(MESSAGE):]

    def stream_block(self, block: str) -> tuple[str | None, str]:
        parts = self._parts(block)
        if parts is None:
            return None, ""
        args = parts[1].lstrip()
        return parts[0], args[:len(args.rstrip())]

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        parts = self._parts(block)
        return None if parts is None else [(parts[0], parts[1].strip())]

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prefix": f"<|channel|>commentary to=functions.{f['name']} <|constrain|>json<|message|>",
                 "schema": f.get("parameters") or {"type": "object", "properties": {}}, "suffix": ""} for f in fns]
