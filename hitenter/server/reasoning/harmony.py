"""gpt-oss's harmony format: a reply is a sequence of messages, each a header and a body.

``<|channel|>analysis<|message|>...<|end|>`` is reasoning; ``<|start|>assistant<|channel|>final
<|message|>...`` is the answer (content); a ``commentary`` message addressed ``to=functions.NAME`` is a
tool call, passed on to the content in one canonical spelling for the harmony tool parser
(``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>``); a commentary
message to no one (a preamble) is content. A body ends at ``<|end|>``, ``<|call|>``, ``<|return|>``,
the next ``<|start|>`` or the reply's end. Text before any header is content (a model that skipped
the format). The markers are control tokens: the reply is decoded with them.
"""

from __future__ import annotations

import re

from hitenter.server.reasoning.base import ReasoningParser, partial_tail

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>", START)
CALL_OPEN, CALL_CLOSE = "<|channel|>commentary to=functions.", "<|call|>"
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")

HEAD, BODY = range(2)


class HarmonyReasoningParser(ReasoningParser):
    name = "harmony"
    needs_special = True
    end_tag = "<|end|><|start|>assistant<|channel|>final<|message|>"

    def __init__(self, opened: bool = False) -> None:
        super().__init__(opened)
        self.state = HEAD
        self.route = "content"          # where the current body goes: reasoning | content | call
        self.started = False            # any header seen

    @property
    def in_thought(self) -> bool:
        return self.route == "reasoning" or (self.state == HEAD and "analysis" in self.buf)

    def _step(self, final: bool) -> bool:
        return self._head(final) if self.state == HEAD else self._body(final)

    def _head(self, final: bool) -> bool:
        s = self.buf.lstrip() if not self.started else self.buf
        if not self.started and not (s.startswith((START, CHANNEL)) or (START.startswith(s) or CHANNEL.startswith(s))):
            self.started, self.state, self.route = True, BODY, "content"     # no harmony markup: content
            return True
        while s.startswith(START):
            s = self.buf = s[len(START):]
            self.started = True
        i = s.find(MESSAGE)
        if i < 0:
            if final and s.strip() and CHANNEL not in s and START not in s:
                self.content.append(s)          # trailing text that is no header: content
            if final:
                self.buf = ""
            return False
        header = s[:i]
        self.buf, self.state, self.started = s[i + len(MESSAGE):], BODY, True
        self.route = self._route(header)
        return True

    def _route(self, header: str) -> str:
        ch = _CHANNEL.search(header)
        channel = ch.group(1) if ch else ""
        to = _RECIPIENT.search(header)
        if to and to.group(1).startswith("functions."):
            self.content.append(f"{CALL_OPEN}{to.group(1)[len('functions.'):]} <|constrain|>json{MESSAGE}")
            return "call"
        return "reasoning" if channel == "analysis" else "content"

    def _body(self, final: bool) -> bool:
        hits = [(i, e) for e in ENDS if (i := self.buf.find(e)) >= 0]
        if hits:
            i, e = min(hits)
            self._emit(self.buf[:i])
            self._close()
            self.buf = self.buf[i + (0 if e == START else len(e)):]
            self.state = HEAD
            return True
        keep = 0 if final else partial_tail(self.buf, ENDS)
        self._emit(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        if final:
            self._close()
        return False

    def _emit(self, text: str) -> None:
        if text:
            (self.reasoning if self.route == "reasoning" else self.content).append(text)

    def _close(self) -> None:
        if self.route == "call":
            self.content.append(CALL_CLOSE)
        self.route = "content"
