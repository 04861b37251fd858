"""GLM 4.5 / 4.6 / 4.7: ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...
</tool_call>``. Values are text, typed by the tool's schema; the name goes out at its line's end,
each argument when its ``</arg_value>`` is complete."""

from __future__ import annotations

import json
import re
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser, json_object, typed_value

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GLMToolParser(ToolParser):
    name = "glm"
    open, close = "<tool_call>", "</tool_call>"

    def _name(self, block: str, closed: bool) -> str | None:
        ends = [i for i in (block.find("\n", 1 if block.startswith("\n") else 0), block.find("<arg_key>")) if i >= 0]
        if not ends and not closed:
            return None
        name = block[:min(ends)] if ends else block
        return name.strip() or None

    def _pairs(self, name: str, block: str) -> list[tuple[str, Any]]:
        fn = self.tools.get(name)
        return [(k.strip(), typed_value(v, k.strip(), fn)) for k, v in _PAIR.findall(block)]

    def stream_block(self, block: str) -> tuple[str | None, str]:
        name = self._name(block, closed=False)
        return (None, "") if name is None else (name, json_object(self._pairs(name, block), closed=False))

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        name = self._name(block, closed=True)
        if name is None or "<" in name or "{" in name:
            return None
        return [(name, json_object(self._pairs(name, block)))]

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for f in fns:
            keys = list((f.get("parameters") or {}).get("properties") or {})
            key = " | ".join(json.dumps(k) for k in keys) or '""'
            out.append({"ebnf": f'root ::= "<tool_call>" {json.dumps(f["name"])} "\\n" ("<arg_key>" ({key}) '
                                f'"</arg_key>\\n<arg_value>" [^<]* "</arg_value>\\n")* "</tool_call>"'})
        return out
