"""Granite 3.x / 4.x: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`` to the reply's end (the
marker is a control token; Granite 4 also writes Hermes ``<tool_call>`` blocks: its template says which)."""

from __future__ import annotations

import json
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser
from hitenter.server.tool_parsers.json_calls import calls_of, json_values, stream_call, unfence


class GraniteToolParser(ToolParser):
    name = "granite"
    needs_special = True
    open, close = "<|tool_call|>", None
    sep = ""

    def stream_block(self, block: str) -> tuple[str | None, str]:
        """The list's first call as it is written (json_calls.stream_call)."""
        text = block.lstrip()
        return stream_call(text[1:]) if text.startswith("[") else (None, "")

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        return calls_of(json_values(unfence(block)))

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prefix": f'<|tool_call|>[{{"name": {json.dumps(f["name"])}, "arguments": ',
                 "schema": f.get("parameters") or {"type": "object", "properties": {}}, "suffix": "}]"} for f in fns]
