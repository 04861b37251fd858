"""Hermes / Qwen2.5 / Qwen3 / SmolLM3: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
A reply that is nothing but one such object (small models drop the tags; fenced or not) naming a
tool of the request is a call too. Inside a block, the name is sent once written and the arguments
as their members are (json_calls.stream_call); a bare reply is sent when it ends."""

from __future__ import annotations

import json
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser
from hitenter.server.tool_parsers.json_calls import (
    as_call,
    calls_of,
    json_values,
    loads,
    stream_call,
    unfence,
)


class HermesToolParser(ToolParser):
    name = "hermes"
    open, close = "<tool_call>", "</tool_call>"
    bare_opening = ("{", "`")

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        return calls_of(json_values(unfence(block)))

    def stream_block(self, block: str) -> tuple[str | None, str]:
        return (None, "") if self.bare else stream_call(block)

    def parse_bare(self, text: str) -> list[ParsedCall] | None:
        call = as_call(loads(unfence(text)), set(self.tools))
        return [call] if call is not None else None

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prefix": f'<tool_call>\n{{"name": {json.dumps(f["name"])}, "arguments": ', "schema": _params(f),
                 "suffix": "}\n</tool_call>"} for f in fns]


def _params(fn: dict[str, Any]) -> dict[str, Any]:
    return fn.get("parameters") or {"type": "object", "properties": {}}
