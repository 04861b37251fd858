"""Granite 3.x / 4.x: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`` to the reply's end (the
marker is a control token; Granite 4 also writes Hermes ``<tool_call>`` blocks: its template says which)."""

from __future__ import annotations

import json
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser
from hitenter.server.tool_parsers.json_calls import calls_of, json_values, unfence


class GraniteToolParser(ToolParser):
    name = "granite"
    needs_special = True
    open, close = "<|tool_call|>", None
    sep = ""

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        return calls_of(json_values(unfence(block)))

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prefix": f'<|tool_call|>[{{"name": {json.dumps(f["name"])}, "arguments": ',
                 "schema": f.get("parameters") or {"type": "object", "properties": {}}, "suffix": "}]"} for f in fns]
