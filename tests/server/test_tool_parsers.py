"""Tool-call parsers (hitenter/server/tool_parsers/): each format's calls and content the same whatever
way the reply is cut into deltas (every cut point, one character at a time), streamed deltas adding up
to the final calls, unparseable blocks kept as text, the parser chosen from real chat templates, and
the forced-call grammars compiling."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from hitenter.engine.structured import build_grammar
from hitenter.sampling_params import StructuredSpec
from hitenter.server.tool_parsers import ToolDelta, ToolParser, tool_parser_for
from hitenter.server.tool_parsers.gemma4 import Gemma4ToolParser
from hitenter.server.tool_parsers.glm import GLMToolParser
from hitenter.server.tool_parsers.granite import GraniteToolParser
from hitenter.server.tool_parsers.harmony import HarmonyToolParser
from hitenter.server.tool_parsers.hermes import HermesToolParser
from hitenter.server.tool_parsers.llama3 import Llama3ToolParser
from hitenter.server.tool_parsers.mistral import MistralToolParser
from hitenter.server.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
PARIS = [("get_weather", {"city": "Paris"})]
PARIS3 = [("get_weather", {"city": "Paris", "days": 3})]


def _run(cls: type[ToolParser], text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]], str, list[Any]]:
    """(streamed content, streamed calls as (name, arguments), final content, final calls)."""
    p, events, pos = cls(TOOLS), [], 0
    for c in [*cuts, len(text)]:
        events += p.feed(text[pos:c])
        pos = c
    events += p.finish()
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ToolDelta):
            c = calls.setdefault(e.index, ["", ""])
            c[0] += e.name or ""
            c[1] += e.arguments
    content = "".join(e for e in events if isinstance(e, str))
    return content, [tuple(calls[i]) for i in sorted(calls)], p.content, p.calls  # type: ignore[misc]


def _parse(cls: type[ToolParser], text: str) -> tuple[str, list[tuple[str, Any]]]:
    whole = _run(cls, text, [])
    for cut in range(len(text) + 1):
        assert _run(cls, text, [cut])[:2] == whole[:2], cut
    assert _run(cls, text, list(range(1, len(text))))[:2] == whole[:2]
    content, streamed, final_content, final = whole
    assert content == final_content
    assert streamed == [(c["function"]["name"], c["function"]["arguments"]) for c in final]
    assert all(c["id"] for c in final)
    return content, [(n, json.loads(a)) for n, a in streamed]


CASES = [
    (HermesToolParser, 'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                       '</tool_call>', "Let me check.", PARIS),
    (HermesToolParser, '{"name": "get_weather", "arguments": {"city": "Paris"}}', "", PARIS),
    (HermesToolParser, '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', "", PARIS),
    (HermesToolParser, '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", '
                       '"arguments": {"x": 1}}</tool_call>', "", [("a", {}), ("b", {"x": 1})]),
    (HermesToolParser, "Plain text  ", "Plain text  ", []),
    (Qwen3CoderToolParser, "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                           "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "Sure.", PARIS3),
    (Qwen3CoderToolParser, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "",
     [("get_weather", {})]),
    (GLMToolParser, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days"
                    "</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", "", PARIS3),
    (Gemma4ToolParser, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>', "", PARIS3),
    (Gemma4ToolParser, '<|tool_call>call:f{a:[1,2],b:{c:true,d:null}}<tool_call|>', "",
     [("f", {"a": [1, 2], "b": {"c": True, "d": None}})]),
    (MistralToolParser, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", PARIS),
    (MistralToolParser, '[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{"city": "Paris"}', "", PARIS),
    (MistralToolParser, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]'
                        '{"city": "Rome"}', "", PARIS + [("get_weather", {"city": "Rome"})]),
    (MistralToolParser, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", PARIS),
    (Llama3ToolParser, '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", PARIS),
    (Llama3ToolParser, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", PARIS),
    (Llama3ToolParser, "The set is {x}", "The set is {x}", []),
    (GraniteToolParser, '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", PARIS),
    (HarmonyToolParser, '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                        '{"city": "Paris"}<|call|>', "", PARIS),
]


@pytest.mark.parametrize(("cls", "text", "content", "calls"), CASES)
def test_calls_at_every_cut(cls: type[ToolParser], text: str, content: str, calls: list[Any]) -> None:
    assert _parse(cls, text) == (content, calls)


@pytest.mark.parametrize(("cls", "text"), [
    (HermesToolParser, '<tool_call>\n{"name": "get_weather", "arguments": {oops}}\n</tool_call> tail'),
    (HermesToolParser, "<tool_call>not json at all"),
    (Gemma4ToolParser, "<|tool_call>call:get_weather{city:Paris}<tool_call|>"),
    (GraniteToolParser, "<|tool_call|>[garbage"),
    (Llama3ToolParser, '{"name": "get_weather", "parameters": '),
])
def test_garbage_stays_text(cls: type[ToolParser], text: str) -> None:
    assert _parse(cls, text) == (text, [])


def test_adversarial_never_raises() -> None:
    rng = random.Random(0)
    alphabet = ["<tool_call>", "</tool_call>", "<function=f>", "<parameter=a>", "</parameter>", "</function>",
                "[TOOL_CALLS]", "[ARGS]", "<|tool_call>", "<tool_call|>", "call:f{", "}", "{", '"', "name",
                ":", "<arg_key>", "</arg_key>", "<arg_value>", "x", "\n", "<|python_tag|>", "<|tool_call|>", "["]
    for _ in range(100):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        for cls in (HermesToolParser, Qwen3CoderToolParser, GLMToolParser, Gemma4ToolParser, MistralToolParser,
                    Llama3ToolParser, GraniteToolParser, HarmonyToolParser):
            _parse_loose(cls, text)


def _parse_loose(cls: type[ToolParser], text: str) -> None:
    """Any text parses, the same at every cut (calls may hold non-JSON arguments where markers made them)."""
    whole = _run(cls, text, [])
    for cut in range(len(text) + 1):
        assert _run(cls, text, [cut])[:2] == whole[:2], (cls.name, text, cut)


def test_parallel_false_keeps_one() -> None:
    p = HermesToolParser(TOOLS, parallel=False)
    p.feed('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>')
    p.finish()
    assert [c["function"]["name"] for c in p.calls] == ["a"]


def test_mistral_ids_are_nine_characters() -> None:
    assert len(MistralToolParser(TOOLS).new_id()) == 9


@pytest.mark.parametrize(("template", "cls"), [
    ("Qwen-Qwen3-0.6B.jinja", HermesToolParser), ("Qwen3-Coder.jinja", Qwen3CoderToolParser),
    ("Qwen3.5-4B.jinja", Qwen3CoderToolParser), ("meta-llama-Llama-3.1-8B-Instruct.jinja", Llama3ToolParser),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", MistralToolParser),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", GraniteToolParser),
    ("openai-gpt-oss-120b.jinja", HarmonyToolParser), ("google-gemma-4-31B-it.jinja", Gemma4ToolParser),
    ("GLM-4.6.jinja", GLMToolParser), ("Qwen-Qwen2.5-7B-Instruct.jinja", HermesToolParser),
])
def test_chosen_from_the_template(template: str, cls: type[ToolParser]) -> None:
    assert tool_parser_for((TEMPLATES / template).read_text()) is cls


@pytest.mark.parametrize("cls", [HermesToolParser, Qwen3CoderToolParser, GLMToolParser, Gemma4ToolParser,
                                 MistralToolParser, Llama3ToolParser, GraniteToolParser, HarmonyToolParser])
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_grammar_compiles(cls: type[ToolParser], parallel: bool) -> None:
    fns = [t["function"] for t in TOOLS] + [{"name": "other", "parameters": {"type": "object", "properties": {}}}]
    value = {"variants": cls(TOOLS).grammar(fns), "parallel": parallel, "sep": cls.sep}
    assert build_grammar(StructuredSpec("tool_calls", json.dumps(value), "tool_choice")) is not None


@pytest.mark.parametrize(("cls", "text"), [
    (HermesToolParser, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'),
    (GraniteToolParser, '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]'),
])
def test_json_call_streams_as_written(cls: type[ToolParser], text: str) -> None:
    """The name goes out before the block ends, the arguments member by member (vLLM streams the JSON as
    it grows); the pieces add up to the parsed call."""
    p, seen = cls(TOOLS), []
    for i, ch in enumerate(text):
        seen += [(i, e) for e in p.feed(ch) if isinstance(e, ToolDelta)]
    seen += [(len(text), e) for e in p.finish() if isinstance(e, ToolDelta)]
    first_args = text.index('"city"')
    assert seen[0][1].name == "get_weather" and seen[0][0] <= first_args + 1
    args = [(i, e.arguments) for i, e in seen if e.arguments]
    assert len(args) >= 3 and args[0][0] < text.index('"days"') + 2
    assert "".join(a for _, a in args) == p.calls[0]["function"]["arguments"] == '{"city": "Paris", "days": 3}'


def test_gemma4_forced_call_grammar_admits_what_its_parser_reads() -> None:
    """The forced-call grammar (tool_choice required / named) admits Gemma 4 calls with nested objects and
    lists (as llama.cpp's gemma4 grammar does), each of which the parser reads, and refuses undeclared keys
    and JSON-quoted strings."""
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    fn = {"name": "plan", "parameters": {"properties": {"city": {}, "stops": {}, "opts": {}}}}
    grammar = Grammar.from_ebnf(Gemma4ToolParser().grammar([fn])[0]["ebnf"])
    good = ['<|tool_call>call:plan{city:<|"|>Paris <3<|"|>,stops:[1,-2.5e3,<|"|>x<|"|>],'
            'opts:{fast:true,none:null,deep:{k:[]}}}<tool_call|>', "<|tool_call>call:plan{}<tool_call|>"]
    for text in good:
        assert _is_grammar_accept_string(grammar, text), text
        assert _parse(Gemma4ToolParser, text)[1], text
    for bad in ['<|tool_call>call:plan{town:1}<tool_call|>', '<|tool_call>call:plan{city:"Paris"}<tool_call|>',
                '<|tool_call>call:other{}<tool_call|>']:
        assert not _is_grammar_accept_string(grammar, bad), bad
