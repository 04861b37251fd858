"""Thinking between a start and an end tag: ``<think>...</think>`` and its relatives.

``TagReasoningParser(start, end)`` is the generic parser (configured from the template's own tags);
the classes below are the families that write the section that way. The reply may open the section
itself (leading whitespace, then the start tag) or the prompt opened it (``opened``); text before a
start tag that is not at the reply's beginning is content. Reasoning is stripped of its surrounding
whitespace, content of its leading whitespace after the end tag (the blank line templates put there).
An unclosed section is all reasoning (a reply cut by max_tokens while thinking).
"""

from __future__ import annotations

from hitenter.server.reasoning.base import ReasoningParser, partial_tail

BEGIN, OPENING, THINK, AFTER, CONTENT = range(5)


def _trailing_space(text: str) -> int:
    return len(text) - len(text.rstrip())


class TagReasoningParser(ReasoningParser):
    """Reasoning between ``start`` and ``end``; see the module docstring."""

    name = "tags"
    start, end_tag = "<think>", "</think>"

    def __init__(self, opened: bool = False, start: str | None = None, end: str | None = None) -> None:
        super().__init__(opened)
        self.start = start or self.start
        self.end_tag = end or self.end_tag
        self.state = OPENING if opened else BEGIN

    @property
    def in_thought(self) -> bool:
        return self.state in (OPENING, THINK) or (self.state == BEGIN and bool(self.buf.strip()))

    def _step(self, final: bool) -> bool:
        if self.state == BEGIN:
            return self._begin(final)
        if self.state == OPENING:
            return self._opening(final)
        if self.state == THINK:
            return self._think(final)
        if self.state == AFTER:
            s = self.buf.lstrip()
            if not s and not final:
                return False
            self.buf, self.state = s, CONTENT
            return True
        if self.buf:
            self.content.append(self._content(final))
        return False

    def _content(self, final: bool) -> str:
        """The content text of the buffer that may go now (all of it here; subclasses filter)."""
        out, self.buf = self.buf, ""
        return out

    def _begin(self, final: bool) -> bool:
        s = self.buf.lstrip()
        if s.startswith(self.start):
            self.buf, self.state = s[len(self.start):], OPENING
            return True
        if self.start.startswith(s) and not final:
            return False                       # may still become the start tag
        self.state = CONTENT
        return True

    def _opening(self, final: bool) -> bool:
        """Just inside the section: leading whitespace (and a repeated start tag) dropped."""
        s = self.buf.lstrip()
        if s.startswith(self.start):
            self.buf = s[len(self.start):]
            return True
        if (not s or self.start.startswith(s)) and not final:
            return False
        self.buf, self.state = s, THINK
        return True

    def _think(self, final: bool) -> bool:
        i = self.buf.find(self.end_tag)
        if i >= 0:
            self.reasoning.append(self.buf[:i].rstrip())
            self.buf, self.state = self.buf[i + len(self.end_tag):], AFTER
            return True
        if final:
            self.reasoning.append(self.buf.rstrip())
            self.buf = ""
            return False
        keep = partial_tail(self.buf, [self.end_tag])
        keep += _trailing_space(self.buf[:len(self.buf) - keep])
        self.reasoning.append(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False


class Qwen3ReasoningParser(TagReasoningParser):
    """Qwen3 / Qwen3.5 / QwQ: ``<think>...</think>``; Qwen3.5's template opens it in the prompt."""
    name = "qwen3"


class DeepSeekR1ReasoningParser(TagReasoningParser):
    """DeepSeek-R1 and its distills: the template ends the prompt with ``<think>\\n``."""
    name = "deepseek_r1"


class SmolLM3ReasoningParser(TagReasoningParser):
    """SmolLM3: ``<think>...</think>`` written by the model in ``/think`` mode."""
    name = "smollm3"


class LFM2ReasoningParser(TagReasoningParser):
    """LFM2 / LFM2.5: ``<think>...</think>``."""
    name = "lfm2"


class Gemma4ReasoningParser(TagReasoningParser):
    """Gemma 4: ``<|channel>thought\\n...<channel|>`` (control tokens); with thinking off the template
    writes an empty channel into the prompt, and the reply is content."""
    name = "gemma4"
    needs_special = True
    start, end_tag = "<|channel>thought", "<channel|>"


class GraniteReasoningParser(TagReasoningParser):
    """Granite 3.2 / 3.3: ``<think>...</think><response>...</response>``; the response tags around the
    answer are dropped (a ``</response>`` with text after it stays)."""
    name = "granite"
    OPEN, CLOSE = "<response>", "</response>"

    def __init__(self, opened: bool = False) -> None:
        super().__init__(opened)
        self.opened_response = False
        self.just_opened = False

    def _content(self, final: bool) -> str:
        if not self.opened_response:
            s = self.buf.lstrip()
            if s.startswith(self.OPEN):
                self.buf, self.opened_response, self.just_opened = s[len(self.OPEN):], True, True
            elif self.OPEN.startswith(s) and not final:
                return ""
            else:
                self.opened_response = True
        if self.just_opened:                      # the newline after <response> is markup
            rest = self.buf.lstrip("\n")
            if not rest and not final:
                return ""
            self.buf, self.just_opened = rest, False
        body = self.buf.rstrip()
        if body.endswith(self.CLOSE):             # the reply's closing tag, if nothing follows it
            if final:
                self.buf = ""
                return body[:-len(self.CLOSE)]
            keep = len(self.buf) - len(body) + len(self.CLOSE)
        else:
            keep = 0 if final else partial_tail(self.buf, [self.CLOSE])
        out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return out
