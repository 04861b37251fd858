"""Llama 3.1 / 3.2 / 3.3: a reply that is a JSON object ``{"name": ..., "parameters": {...}}`` (several
separated by ``;``), optionally after ``<|python_tag|>``. Without the tag only a reply that starts
with the object counts (text before it is an answer); a call is sent when the reply ends."""

from __future__ import annotations

import json
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser
from hitenter.server.tool_parsers.json_calls import calls_of, json_values, unfence


class Llama3ToolParser(ToolParser):
    name = "llama3"
    open, close = "<|python_tag|>", None
    bare_opening = ("{", "`")
    sep = "; "

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        return calls_of(json_values(unfence(block)))

    def parse_bare(self, text: str) -> list[ParsedCall] | None:
        return calls_of(json_values(unfence(text)), set(self.tools) or None)

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prefix": f'{{"name": {json.dumps(f["name"])}, "parameters": ',
                 "schema": f.get("parameters") or {"type": "object", "properties": {}}, "suffix": "}"} for f in fns]
