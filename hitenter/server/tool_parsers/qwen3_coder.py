"""Qwen3-Coder (and Qwen3.5): ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
</function>\\n</tool_call>``. Values are text, typed by the tool's schema (tool_parsers.base.typed_value).
The name goes out when ``<function=NAME>`` is complete, each parameter when its ``</parameter>`` is."""

from __future__ import annotations

import json
import re
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser, json_object, typed_value

_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _value(raw: str) -> str:
    """A parameter's text without the newline the format puts on each side of it."""
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"
    open, close = "<tool_call>", "</tool_call>"

    def _pairs(self, name: str, body: str) -> list[tuple[str, Any]]:
        fn = self.tools.get(name)
        return [(k.strip(), typed_value(_value(v), k.strip(), fn)) for k, v in _PARAM.findall(body)]

    def stream_block(self, block: str) -> tuple[str | None, str]:
        m = _FUNCTION.search(block)
        if m is None:
            return None, ""
        name = m.group(1).strip()
        return name, json_object(self._pairs(name, block[m.end():]), closed=False)

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        out = []
        for part in block.split("</function>"):
            m = _FUNCTION.search(part)
            if m is not None:
                name = m.group(1).strip()
                out.append((name, json_object(self._pairs(name, part[m.end():]))))
        return out or None

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for f in fns:
            keys = list((f.get("parameters") or {}).get("properties") or {})
            param = (" | ".join(f'"<parameter={k}>\\n" value "\\n</parameter>\\n"' for k in keys)) or '""'
            out.append({"ebnf": f'root ::= "<tool_call>\\n<function=" {json.dumps(f["name"])} ">\\n" '
                                f'({param})* "</function>\\n</tool_call>"\nvalue ::= [^<]*'})
        return out
