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
    writes an empty channel into the prompt, and the reply is content.

    In the content, as llama.cpp's gemma4 parser reads it: a later ``<|channel>thought ... <channel|>``
    block (the model may append an empty one; empty ``<|channel>`` markers before it dropped) is reasoning
    too (its leading whitespace dropped); any other ``<|channel>`` or an unmatched ``<channel|>`` ends the
    reply (it and what follows are dropped: llama.cpp's lenient parse stops there)."""
    name = "gemma4"
    needs_special = True
    start, end_tag = "<|channel>thought", "<channel|>"
    OPEN, WORD = "<|channel>", "thought"

    def __init__(self, opened: bool = False) -> None:
        super().__init__(opened)
        self.late = False         # inside a thought block that follows content
        self.late_start = False   # ... before its first non-space character
        self.ended = False        # an unmatched <channel|> was read: the rest is dropped

    @property
    def in_thought(self) -> bool:
        return self.late or super().in_thought

    def _content(self, final: bool) -> str:
        out: list[str] = []
        while self.buf and not self.ended:
            if self.late:
                if not self._late_thought(final):
                    break
                continue
            i, j = self.buf.find(self.OPEN), self.buf.find(self.end_tag)
            if i < 0 and j < 0:
                keep = 0 if final else partial_tail(self.buf, [self.OPEN, self.end_tag])
                out.append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            if j >= 0 and (i < 0 or j < i):   # an unmatched end: the reply ends here
                out.append(self.buf[:j])
                self.ended = True
                break
            out.append(self.buf[:i])
            rest = self.buf[i:]
            while rest.startswith(self.OPEN):   # empty channel markers before a thought block: dropped
                rest = rest[len(self.OPEN):]
            if rest.startswith(self.WORD):
                self.buf, self.late, self.late_start = rest[len(self.WORD):], True, True
            elif (self.WORD.startswith(rest) or self.OPEN.startswith(rest)) and not final:
                self.buf = self.buf[i:]   # may still become "<|channel>thought"
                break
            else:                         # a channel that is not a thought block: the reply ends here
                self.ended = True
        if self.ended:
            self.buf = ""
        return "".join(out)

    def _late_thought(self, final: bool) -> bool:
        """Reasoning of a thought block after content, up to its end tag; True once it closed."""
        if self.late_start:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return False
            self.late_start = False
        k = self.buf.find(self.end_tag)
        if k >= 0:
            self.reasoning.append(self.buf[:k])
            self.buf, self.late = self.buf[k + len(self.end_tag):], False
            return True
        keep = 0 if final else partial_tail(self.buf, [self.end_tag])
        self.reasoning.append(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False


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
