"""Which tool-call parser a model gets, read off its chat template: the markup its template writes
for an assistant's calls (and tells the model to write). A template with no markup of its own gets
Hermes ``<tool_call>`` (what hitenter's tool prompt asked of such models before)."""

from __future__ import annotations

from hitenter.server.tool_parsers.base import ToolParser
from hitenter.server.tool_parsers.gemma4 import Gemma4ToolParser
from hitenter.server.tool_parsers.glm import GLMToolParser
from hitenter.server.tool_parsers.granite import GraniteToolParser
from hitenter.server.tool_parsers.harmony import HarmonyToolParser
from hitenter.server.tool_parsers.hermes import HermesToolParser
from hitenter.server.tool_parsers.llama3 import Llama3ToolParser
from hitenter.server.tool_parsers.mistral import MistralToolParser
from hitenter.server.tool_parsers.qwen3_coder import Qwen3CoderToolParser

_MARKS: list[tuple[tuple[str, ...], type[ToolParser]]] = [
    (("<|channel|>", "functions."), HarmonyToolParser),
    (("<|tool_call>",), Gemma4ToolParser),
    (("<function=", "<parameter="), Qwen3CoderToolParser),
    (("<arg_key>",), GLMToolParser),
    (("[TOOL_CALLS]",), MistralToolParser),
    (("<|tool_call|>",), GraniteToolParser),
    (("<tool_call>",), HermesToolParser),
    (("<|python_tag|>",), Llama3ToolParser),
    (('"parameters": ',), Llama3ToolParser),
]


def tool_parser_for(template: str | None) -> type[ToolParser]:
    """The tool-call parser class of a model with this chat template."""
    for marks, cls in _MARKS:
        if template and all(m in template for m in marks):
            return cls
    return HermesToolParser
