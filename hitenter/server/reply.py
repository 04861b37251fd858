"""One assistant reply (one prompt, one choice) as the non-OpenAI-chat surfaces see it: Ollama's chat and
generate, OpenAI Responses and Anthropic Messages build their bodies and streams from this.

``Reply.of(out, plan)``: a finished RequestOutput split into content and tool calls, with its finish
and token counts. ``reply_events(src, plan)``: a stream of ``Piece`` (text safe to send now, the
logprobs of the tokens it came from) ending in one ``Done`` (the Reply); text that may still become a
``<tool_call>`` is held back (tools.ToolTextStream).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.server.streams import Source
from hitenter.server.tools import ToolPlan, ToolTextStream, split_reply


@dataclass
class Reply:
    content: str
    calls: list[dict[str, Any]]               # {"id", "type": "function", "function": {"name", "arguments"}}
    finish_reason: str                        # "stop" | "length"
    stop_reason: int | str | None             # the matched stop string or token id
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    metrics: Any = None                       # RequestMetricsSnapshot

    @classmethod
    def of(cls, out: RequestOutput, plan: ToolPlan,
           parsed: tuple[str | None, list[dict[str, Any]]] | None = None) -> Reply:
        """``parsed``: (content, calls) already split out of the text (a stream's), else split here."""
        c = out.outputs[0]
        content, calls = parsed if parsed is not None else split_reply(c.text, plan)
        return cls(content or "", calls, c.finish_reason if c.finish_reason in ("stop", "length") else "stop",
                   c.stop_reason, len(out.prompt_token_ids), len(c.token_ids), out.num_cached_tokens,
                   list(c.token_ids), list(out.prompt_token_ids), c.logprobs, out.metrics)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def stop_string(self) -> str | None:
        return self.stop_reason if isinstance(self.stop_reason, str) else None


@dataclass
class Piece:
    text: str
    logprobs: list[PositionLogprobs] = field(default_factory=list)


@dataclass
class Done:
    reply: Reply


async def reply_events(src: Source, plan: ToolPlan) -> AsyncIterator[Piece | Done]:
    """Pieces of the reply's text as they become safe to send, then Done."""
    ts = ToolTextStream(plan)
    async for _, out in src:
        c = out.outputs[0]
        piece = ts.feed(c.delta_text)
        if piece or c.delta_logprobs:
            yield Piece(piece, list(c.delta_logprobs or []))
        if out.finished:
            rest, calls = ts.finish()
            if rest:
                yield Piece(rest)
            content = split_reply(ts.text, plan)[0] if calls else ts.text
            yield Done(Reply.of(out, plan, (content, calls)))
            return
