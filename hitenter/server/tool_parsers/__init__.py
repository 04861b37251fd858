"""Tool-call parsers: the calls a model writes in its family's markup, one small class per format
(base.py: the streaming contract and driver; select.py: which one a model gets)."""

from hitenter.server.tool_parsers.base import Event, ToolDelta, ToolParser
from hitenter.server.tool_parsers.select import tool_parser_for

__all__ = ["Event", "ToolDelta", "ToolParser", "tool_parser_for"]
