"""Gemma 4: ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`` where a string is ``<|"|>text<|"|>``,
keys are bare, and numbers, booleans, null, lists and objects are written as in JSON (llama.cpp's
``gemma4_to_json``). A call goes out when its block closes (a block whose arguments do not read stays text). The markers
are control tokens."""

from __future__ import annotations

import json
import re
from typing import Any

from hitenter.server.tool_parsers.base import ParsedCall, ToolParser

QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NAME = re.compile(r"\s*call:([^{\s]+)\{")


class _Reader:
    """Recursive descent over one Gemma 4 value; ``ValueError`` when the text is not one."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \n\t\r":
            self.i += 1

    def value(self) -> Any:
        self.ws()
        s, i = self.s, self.i
        if s.startswith(QUOTE, i):
            end = s.find(QUOTE, i + len(QUOTE))
            if end < 0:
                raise ValueError("unclosed string")
            self.i = end + len(QUOTE)
            return s[i + len(QUOTE):end]
        if s.startswith("{", i):
            return self.mapping()
        if s.startswith("[", i):
            return self.sequence()
        for word, v in (("true", True), ("false", False), ("null", None)):
            if s.startswith(word, i):
                self.i += len(word)
                return v
        m = _NUMBER.match(s, i)
        if m is None:
            raise ValueError(f"no value at {i}")
        self.i = m.end()
        return json.loads(m.group(0))

    def mapping(self) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        self.ws()
        if self.s.startswith("}", self.i):
            self.i += 1
            return out
        while True:
            self.ws()
            if self.s.startswith(QUOTE, self.i):
                key = self.value()
            else:
                end = self.s.find(":", self.i)
                if end < 0:
                    raise ValueError("no ':' after a key")
                key = self.s[self.i:end].strip()
                self.i = end
            self.ws()
            if not self.s.startswith(":", self.i):
                raise ValueError("no ':' after a key")
            self.i += 1
            out[str(key)] = self.value()
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
                continue
            if self.s.startswith("}", self.i):
                self.i += 1
                return out
            raise ValueError("no ',' or '}' after a value")

    def sequence(self) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        self.ws()
        if self.s.startswith("]", self.i):
            self.i += 1
            return out
        while True:
            out.append(self.value())
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
                continue
            if self.s.startswith("]", self.i):
                self.i += 1
                return out
            raise ValueError("no ',' or ']' after a value")


def gemma_to_json(text: str) -> str | None:
    """The JSON of one Gemma 4 object ``{...}`` (None when ``text`` is not exactly one)."""
    r = _Reader(text)
    try:
        r.ws()
        if not text[r.i:].startswith("{"):
            return None
        obj = r.mapping()
        r.ws()
    except (ValueError, RecursionError):
        return None
    return json.dumps(obj, ensure_ascii=False) if r.i == len(text) else None


class Gemma4ToolParser(ToolParser):
    name = "gemma4"
    needs_special = True
    open, close = "<|tool_call>", "<tool_call|>"
    sep = ""

    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        m = _NAME.match(block)
        if m is None:
            return None
        args = gemma_to_json(block[m.end() - 1:].rstrip())
        return None if args is None else [(m.group(1), args)]

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One call of each function in Gemma 4's syntax (what llama.cpp's gemma4 grammar admits): its declared
        parameters as keys, values of any Gemma 4 type (strings, numbers, booleans, null, nested objects with
        bare keys, lists), not typed by the schema (llama.cpp's is not either)."""
        out = []
        for f in fns:
            keys = list((f.get("parameters") or {}).get("properties") or {})
            key = " | ".join(json.dumps(k) for k in keys) or '""'
            out.append({"ebnf": (
                f'root ::= "<|tool_call>call:" {json.dumps(f["name"])} "{{" (pair ("," pair)*)? "}}<tool_call|>"\n'
                f'pair ::= ({key}) ":" value\n' + VALUE_EBNF)})
        return out


# a Gemma 4 value (gemma_to_json reads every text this admits); a string holds no "<|" (its closing quote's start)
VALUE_EBNF = (
    'value ::= string | number | "true" | "false" | "null" | object | list\n'
    'string ::= "<|\\"|>" ([^<] | "<" [^|])* "<|\\"|>"\n'
    'number ::= "-"? [0-9]+ ("." [0-9]+)? ([eE] [-+]? [0-9]+)?\n'
    'object ::= "{" (member ("," member)*)? "}"\n'
    'member ::= [^:},<{\\[\\]]+ ":" value\n'
    'list ::= "[" (value ("," value)*)? "]"')
