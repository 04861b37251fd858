"""How each API puts its stream on the wire: the media type, one event as bytes, a failure in the
middle of a stream, and the end.

- ``OPENAI_SSE``: ``data: {json}`` events, a failure as ``data: {"error": ...}``, then ``data: [DONE]``;
- ``NAMED_SSE`` (Anthropic Messages, OpenAI Responses): ``event: <type>`` + ``data: {json}``, the type
  taken from the event's own ``type``; a failure as an ``error`` event; no end marker;
- ``NDJSON`` (Ollama): one JSON object per line; a failure as ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hitenter.server.api_error import APIError


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> str:
    """One unnamed server-sent event: ``data: {json}`` and a blank line."""
    return "data: " + _json(obj) + "\n\n"


DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Framing:
    media_type: str
    dialect: str            # whose error shape a failure takes (api_error.APIError.body)
    named: bool = False     # SSE with ``event:`` lines
    ndjson: bool = False
    done: str = ""          # the end marker

    def event(self, obj: dict[str, Any]) -> bytes:
        if self.ndjson:
            return (_json(obj) + "\n").encode("utf-8", "replace")
        if self.named:
            return f"event: {obj.get('type', 'message')}\ndata: {_json(obj)}\n\n".encode("utf-8", "replace")
        return sse(obj).encode("utf-8", "replace")

    def failure(self, err: APIError) -> bytes:
        body = err.body(self.dialect)
        if self.dialect == "openai" and self.named:          # Responses: {"type": "error", code, message}
            body = {"type": "error", "code": str(err.status), "message": err.message, "param": err.param}
        return self.event(body)

    def end(self) -> bytes:
        return self.done.encode()


OPENAI_SSE = Framing("text/event-stream", "openai", done=DONE)
NAMED_SSE_OPENAI = Framing("text/event-stream", "openai", named=True)
NAMED_SSE_ANTHROPIC = Framing("text/event-stream", "anthropic", named=True)
NDJSON = Framing("application/x-ndjson", "ollama", ndjson=True)
