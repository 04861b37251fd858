"""Reasoning parsers: a reply's thinking section split from its answer, one small class per format
(base.py: the streaming contract; select.py: which one a model gets)."""

from hitenter.server.reasoning.base import EFFORTS, ReasoningParser, Split
from hitenter.server.reasoning.select import ReasoningFormat, reasoning_parser_for

__all__ = ["EFFORTS", "ReasoningFormat", "ReasoningParser", "Split", "reasoning_parser_for"]
