"""The streaming contract every reasoning parser keeps, and the tag-scanning helper they share.

A ``ReasoningParser`` is fed a reply's text deltas in order (``feed``) and returns, for each, the
``(reasoning, content)`` text that is now certain; ``finish()`` returns what was held back. Whatever
way the text is cut into deltas (down to one character at a time, a tag split anywhere), the
concatenated outputs are the same: a parser holds back only a tail that may still become a tag.

``opened``: the prompt already opened the thinking section (the template wrote the start tag, as the
DeepSeek-R1 distills and Qwen3.5 do), so the reply starts inside it.
"""

from __future__ import annotations

from collections.abc import Sequence

Split = tuple[str, str]          # (reasoning text, content text)
EFFORTS = ("low", "medium", "high")          # the thinking levels templates take (reasoning_effort)


def partial_tail(text: str, tags: Sequence[str]) -> int:
    """Length of the longest proper suffix of ``text`` that is a prefix of one of ``tags`` (a tag that
    may be completed by the next delta)."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


class ReasoningParser:
    """Base class: subclasses implement ``_step`` over the buffered text."""

    name = "base"
    needs_special = False        # its markers are control tokens: the reply must be decoded with them
    end_tag = ""                 # the text that closes the thinking section (what a budget forces)

    def __init__(self, opened: bool = False) -> None:
        self.buf = ""
        self.done = False
        self.reasoning: list[str] = []
        self.content: list[str] = []

    def feed(self, delta: str) -> Split:
        """The reasoning and content that ``delta`` makes certain."""
        self.buf += delta
        return self._drain(final=False)

    def finish(self) -> Split:
        """Everything still held back, at the end of the reply."""
        if self.done:
            return "", ""
        self.done = True
        return self._drain(final=True)

    @property
    def in_thought(self) -> bool:
        """Whether the text read so far ends inside the thinking section."""
        return False

    def _drain(self, final: bool) -> Split:
        r0, c0 = len(self.reasoning), len(self.content)
        while self._step(final):
            pass
        return "".join(self.reasoning[r0:]), "".join(self.content[c0:])

    def _step(self, final: bool) -> bool:
        """Consume a piece of ``self.buf`` into ``self.reasoning`` / ``self.content``; True to go on."""
        raise NotImplementedError

    def split(self, text: str) -> Split:
        """A whole reply at once (same result as feeding it in any pieces)."""
        r1, c1 = self.feed(text)
        r2, c2 = self.finish()
        return r1 + r2, c1 + c2
