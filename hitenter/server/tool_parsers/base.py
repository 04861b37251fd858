"""The streaming contract every tool-call parser keeps, and the driver they share.

A ``ToolParser`` is fed a reply's content deltas (after any reasoning was split off) and returns
events: ``str`` (content safe to send now) and ``ToolDelta`` (a call's id and name when first known,
then argument text to append). ``finish()`` returns the rest; ``calls`` and ``text`` then hold the
whole result. However the content is cut into deltas, the events add up to the same calls and text.

A format is a block marker pair: content until ``open``, a call block until ``close`` (None: until the
next ``open`` or the reply's end). A subclass parses a finished block (``parse_block``: the calls in
it, or None when it is not a call, then the block stays text exactly as written), and may tell the
name and a stable prefix of the arguments of a block still being written (``stream_block``), so
they are sent before the block ends. Whitespace before a call is not content; ``parallel=False``
keeps the first call. ``tools``: the request's tools in OpenAI's form (their schemas type the values
of formats whose arguments are not JSON).

``grammar(fns)``: the forced-call constraint (``tool_choice`` required / named) in the format's own
spelling, one variant per allowed function.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from hitenter.server.reasoning.base import partial_tail

ParsedCall = tuple[str, str]          # (name, arguments as a JSON text)


@dataclass
class ToolDelta:
    index: int
    id: str | None = None              # with the name, in a call's first delta
    name: str | None = None
    arguments: str = ""


Event = str | ToolDelta


@dataclass
class _Streamed:
    index: int
    id: str
    name: str = ""
    args: str = ""


def json_object(pairs: list[tuple[str, Any]], closed: bool = True) -> str:
    """``json.dumps`` of an object given as pairs (its form is the same whether it is closed or not)."""
    body = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in pairs)
    return "{" + body + ("}" if closed else "")


def typed_value(raw: str, name: str, fn: dict[str, Any] | None) -> Any:
    """A parameter's text as its schema's type: strings (and parameters without a schema) stay text,
    others are read as JSON when they parse."""
    props = ((fn or {}).get("parameters") or {}).get("properties") or {}
    kind = (props.get(name) or {}).get("type", "string")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return raw
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return raw


def _closed(prefix: str) -> str:
    """Streamed arguments made whole: an object prefix (``json_object(..., closed=False)``) closed."""
    try:
        json.loads(prefix)
        return prefix
    except (json.JSONDecodeError, RecursionError):
        return prefix + "}" if prefix.startswith("{") else prefix


class ToolParser:
    name = "base"
    needs_special = False
    open = "<tool_call>"
    close: str | None = "</tool_call>"
    sep = "\n"                          # between forced parallel calls

    def __init__(self, tools: list[dict[str, Any]] | None = None, parallel: bool = True) -> None:
        self.tools = {t["function"]["name"]: t["function"] for t in tools or [] if "function" in t}
        self.parallel = parallel
        self.buf = ""
        self.in_block = False
        self.bare = False                # the block began without the open marker (runs to the end)
        self.space = ""                  # trailing whitespace held: not content if a call follows
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.current: _Streamed | None = None
        self.done = False

    # ---- the driver ---------------------------------------------------------------------------------
    def feed(self, delta: str) -> list[Event]:
        self.buf += delta
        out: list[Event] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Event]:
        if self.done:
            return []
        self.done = True
        out: list[Event] = []
        while self._step(out, final=True):
            pass
        if self.space and not self.calls:
            self.text.append(self.space)
            out.append(self.space)
        self.space = ""
        return out

    @property
    def content(self) -> str:
        return "".join(self.text)

    def _step(self, out: list[Event], final: bool) -> bool:
        if self.in_block:
            return self._block_step(out, final)
        i = self.buf.find(self.open) if self.open else -1
        if i >= 0:
            self._say(out, self.buf[:i])
            self.buf, self.in_block = self.buf[i + len(self.open):], True
            return True
        if self._bare_start(final):
            self.in_block = True
            return True
        keep = 0 if final else max(partial_tail(self.buf, [self.open]) if self.open else 0, self._hold())
        self._say(out, self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False

    def _say(self, out: list[Event], text: str, hold: bool = True) -> None:
        if not text:
            return
        text = self.space + text
        body = text.rstrip() if hold else text
        self.space = text[len(body):]
        if body:
            self.text.append(body)
            out.append(body)

    def _block_step(self, out: list[Event], final: bool) -> bool:
        end, skip = self._block_end()
        if end < 0 and not final:
            marks = [m for m in (self.close, self.open) if m and not self.bare]
            self._stream(out, self.buf[:len(self.buf) - partial_tail(self.buf, marks)])
            return False
        block = self.buf if end < 0 else self.buf[:end]
        self.buf = "" if end < 0 else self.buf[end + skip:]
        self.in_block = False
        self._finish_block(out, block, closed=end >= 0)
        return bool(self.buf)

    def _block_end(self) -> tuple[int, int]:
        """(where the block being read ends, the length of its closing marker), (-1, 0) if not yet."""
        if self.bare:
            return -1, 0
        if self.close is not None:
            i = self.buf.find(self.close)
            return (i, len(self.close)) if i >= 0 else (-1, 0)
        i = self.buf.find(self.open) if self.open else -1
        return (i, 0) if i >= 0 else (-1, 0)

    def _stream(self, out: list[Event], block: str) -> None:
        name, prefix = self.stream_block(block)
        if name is None or not self._wanted():
            return
        cur = self.current
        if cur is None:
            cur = self.current = _Streamed(len(self.calls), self.new_id(), name)
            out.append(ToolDelta(cur.index, cur.id, name, ""))
        if len(prefix) > len(cur.args) and prefix.startswith(cur.args):
            out.append(ToolDelta(cur.index, arguments=prefix[len(cur.args):]))
            cur.args = prefix

    def _finish_block(self, out: list[Event], block: str, closed: bool) -> None:
        bare, self.bare = self.bare, False
        parsed = self.parse_bare(block) if bare else self.parse_block(block, closed)
        cur, self.current = self.current, None
        if not parsed:
            if cur is None:
                self._say(out, block if bare else self._as_text(block, closed), hold=False)
                return
            parsed = [(cur.name, _closed(cur.args))]     # already sent: the call stands as streamed
        for k, (name, args) in enumerate(parsed):
            if not self._wanted():
                break
            if k == 0 and cur is not None:          # its name (and part of its arguments) went out
                call_id, name = cur.id, cur.name
                if not args.startswith(cur.args):
                    args = _closed(cur.args)            # the call stands as streamed
                if len(args) > len(cur.args):
                    out.append(ToolDelta(cur.index, arguments=args[len(cur.args):]))
            else:
                call_id = self.new_id()
                out.append(ToolDelta(len(self.calls), call_id, name, ""))
                out.append(ToolDelta(len(self.calls), arguments=args))
            self.calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
        self.space = ""

    def _as_text(self, block: str, closed: bool) -> str:
        return self.open + block + (self.close or "" if closed else "")

    def _wanted(self) -> bool:
        return self.parallel or not self.calls

    # ---- what a format defines ----------------------------------------------------------------------
    def parse_block(self, block: str, closed: bool) -> list[ParsedCall] | None:
        """The calls in a block (None or []: it is not a call, and stays text)."""
        raise NotImplementedError

    def stream_block(self, block: str) -> tuple[str | None, str]:
        """(name, stable prefix of the arguments) of the first call of a block still being written."""
        return None, ""

    def _bare_start(self, final: bool) -> bool:
        """Whether the reply starts a call without the ``open`` marker (formats whose ``bare_opening``
        names how such a call begins: then the whole reply is held and read by ``parse_bare``)."""
        if not self.bare_opening or self.text or self.calls or self.space.strip():
            return False
        if self.buf.lstrip()[:1] in self.bare_opening:
            self.bare = True
        return self.bare

    bare_opening: tuple[str, ...] = ()

    def parse_bare(self, text: str) -> list[ParsedCall] | None:
        """The calls of a reply that is nothing but calls without markers (None: it is text)."""
        return None

    def _hold(self) -> int:
        """Characters at the end of the buffer to hold back beyond a partial ``open``."""
        return 0

    def new_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def grammar(self, fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Forced-call variants: {"prefix", "schema", "suffix"} (JSON arguments) or {"ebnf"} per function."""
        raise NotImplementedError
