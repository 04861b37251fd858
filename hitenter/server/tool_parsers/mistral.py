"""Mistral: ``[TOOL_CALLS]name[ARGS]{...}`` per call (tokenizer v11+; ``[CALL_ID]id`` may sit before
``[ARGS]``) or the older ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``. The markers are
control tokens. The name goes out when ``[ARGS]`` arrives, the arguments as they are written (the
markers make it a call even when they are not JSON). Call
ids are 9 letters and digits: Mistral's templates refuse any other when the call is sent back."""

from __future__ import annotations

import secrets
import string
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser
from hitenter.server.tool_parsers.json_calls import calls_of, json_values

ARGS, CALL_ID = "[ARGS]", "[CALL_ID]"
_ALNUM = string.ascii_letters + string.digits


class MistralToolParser(ToolParser):
    name = "mistral"
    needs_special = True
    open, close = "[TOOL_CALLS]", None
    sep = ""

    def _split(self, block: str) -> tuple[str, str] | None:
        i = block.find(ARGS)
        if i < 0 or block.lstrip().startswith("["):
            return None
        name = block[:i].split(CALL_ID)[0].strip()
        return (name, block[i + len(ARGS):]) if name else None

    def stream_block(self, block: str) -> tuple[str | None, str]:
        parts = self._split(block)
        if parts is None:
            return None, ""
        args = parts[1].lstrip()
        return parts[0], args[:len(args.rstrip())]

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        parts = self._split(block)
        if parts is None:
            return calls_of(json_values(block.strip()))
        return [(parts[0], parts[1].strip())]        # the markers made it a call, JSON or not

    def new_id(self) -> str:
        return "".join(secrets.choice(_ALNUM) for _ in range(9))

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prefix": f"[TOOL_CALLS]{f['name']}[ARGS]",
                 "schema": f.get("parameters") or {"type": "object", "properties": {}}, "suffix": ""} for f in fns]


