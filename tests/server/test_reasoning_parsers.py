"""Reasoning parsers (hitenter/server/reasoning/): each format split into (reasoning, content) the same
way whatever way the reply is cut into deltas (every cut point, one character at a time), unclosed
and adversarial sections, and the choice of parser from real chat templates (tests/data/templates/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hitenter.server.reasoning import reasoning_parser_for
from hitenter.server.reasoning.base import ReasoningParser
from hitenter.server.reasoning.harmony import HarmonyReasoningParser
from hitenter.server.reasoning.tags import (
    Gemma4ReasoningParser,
    GraniteReasoningParser,
    Qwen3ReasoningParser,
    TagReasoningParser,
)

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
HARMONY_CALL = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>'


def _all_cuts(make: type[ReasoningParser] | object, text: str) -> tuple[str, str]:
    """The split of ``text``, checked equal for every two-piece cut and for one character at a time."""
    whole = make().split(text)  # type: ignore[operator]
    for cut in range(len(text) + 1):
        p = make()  # type: ignore[operator]
        parts = [p.feed(text[:cut]), p.feed(text[cut:]), p.finish()]
        assert ("".join(r for r, _ in parts), "".join(c for _, c in parts)) == whole, cut
    p = make()  # type: ignore[operator]
    parts = [p.feed(ch) for ch in text] + [p.finish()]
    assert ("".join(r for r, _ in parts), "".join(c for _, c in parts)) == whole
    return whole


CASES = [
    (Qwen3ReasoningParser, "<think>\nI think.\n</think>\n\nAnswer.", ("I think.", "Answer.")),
    (Qwen3ReasoningParser, "  <think>a</think>b", ("a", "b")),
    (Qwen3ReasoningParser, "No thinking at all.", ("", "No thinking at all.")),
    (Qwen3ReasoningParser, "Text then <think>late</think>", ("", "Text then <think>late</think>")),
    (Qwen3ReasoningParser, "<think>cut by max_tokens", ("cut by max_tokens", "")),
    (Qwen3ReasoningParser, "<think></think>", ("", "")),
    (Qwen3ReasoningParser, "<think>a</think>b</think>c", ("a", "b</think>c")),
    (Qwen3ReasoningParser, "<thin", ("", "<thin")),
    (Qwen3ReasoningParser, "<think>x</thin", ("x</thin", "")),
    (GraniteReasoningParser, "<think>hmm</think><response>Yes.</response>", ("hmm", "Yes.")),
    (GraniteReasoningParser, "<response>Only.</response>", ("", "Only.")),
    (Gemma4ReasoningParser, "<|channel>thought\nhmm<channel|>Yes.", ("hmm", "Yes.")),
    (Gemma4ReasoningParser, "Yes.", ("", "Yes.")),
    # llama.cpp's reading of the content: a trailing (empty) thought block, a late one, a stray end marker,
    # an empty channel marker
    (Gemma4ReasoningParser, "<|channel>thought\nhmm<channel|>Yes.<|channel>thought\n<channel|>", ("hmm", "Yes.")),
    (Gemma4ReasoningParser, "Yes.<|channel>thought\n more<channel|> And.", ("more", "Yes. And.")),
    (Gemma4ReasoningParser, "Yes.<channel|>dropped<|channel>thought x<channel|>", ("", "Yes.")),
    (Gemma4ReasoningParser, "Yes.<|channel> and<|channel>", ("", "Yes.")),
    (Gemma4ReasoningParser, "Yes.<|channel>though", ("", "Yes.")),
    (Gemma4ReasoningParser, "Yes.<|channel><|channel>thought x<channel|>z", ("x", "Yes.z")),
    (Gemma4ReasoningParser, "Yes.<|channel>thought\nunclosed", ("unclosed", "Yes.")),
    (HarmonyReasoningParser, "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
                             "<|message|>Answer.", ("Think.", "Answer.")),
    (HarmonyReasoningParser, "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary"
                             ' to=functions.f <|constrain|>json<|message|>{"a": 1}', ("Think.", HARMONY_CALL)),
    (HarmonyReasoningParser, "<|start|>assistant<|channel|>commentary<|message|>Preamble.<|end|>", ("", "Preamble.")),
    (HarmonyReasoningParser, "<|channel|>analysis<|message|>unclosed", ("unclosed", "")),
    (HarmonyReasoningParser, "plain text, no harmony", ("", "plain text, no harmony")),
    (HarmonyReasoningParser, "<|channel|>analysis", ("", "")),
]


@pytest.mark.parametrize(("cls", "text", "want"), CASES)
def test_split_at_every_cut(cls: type[ReasoningParser], text: str, want: tuple[str, str]) -> None:
    assert _all_cuts(cls, text) == want


def test_opened_by_the_prompt() -> None:
    assert _all_cuts(lambda: Qwen3ReasoningParser(opened=True), "I think.\n</think>\n\nAnswer.") == ("I think.", "Answer.")
    assert _all_cuts(lambda: Qwen3ReasoningParser(opened=True), "<think>\nagain</think>x") == ("again", "x")


def test_generic_tags() -> None:
    make = lambda: TagReasoningParser(False, "<seed:think>", "</seed:think>")  # noqa: E731
    assert _all_cuts(make, "<seed:think>a b</seed:think>c") == ("a b", "c")


def test_adversarial_bytes_never_raise() -> None:
    import random
    rng = random.Random(0)
    alphabet = ["<think>", "</think>", "<|channel|>", "<|message|>", "<|end|>", "<|start|>", "analysis", "final",
                "<channel|>", "<|channel>", "thought", "<", ">", "|", "x", "\n", " ", "<response>", "</response>"]
    for _ in range(150):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        for cls in (Qwen3ReasoningParser, GraniteReasoningParser, Gemma4ReasoningParser, HarmonyReasoningParser):
            _all_cuts(cls, text)


@pytest.mark.parametrize(("template", "name", "opened"), [
    ("Qwen-Qwen3-0.6B.jinja", "qwen3", False),
    ("Qwen3.5-4B.jinja", "qwen3", True),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek_r1", True),
    ("HuggingFaceTB-SmolLM3-3B.jinja", "smollm3", False),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "granite", False),
    ("openai-gpt-oss-120b.jinja", "harmony", False),
    ("google-gemma-4-31B-it.jinja", "gemma4", False),
    ("GLM-4.6.jinja", "tags", False),
    ("LFM2.5-8B-A1B.jinja", "lfm2", False),
])
def test_chosen_from_the_template(template: str, name: str, opened: bool) -> None:
    from hitenter.tokenizer.chat_template import render_chat_template

    text = (TEMPLATES / template).read_text()
    fmt = reasoning_parser_for(text, set())
    assert fmt is not None and fmt.name == name
    prompt = render_chat_template(text, [{"role": "user", "content": "Hi"}], enable_thinking=True)
    assert fmt.opens(prompt[-40:]) is opened


@pytest.mark.parametrize("template", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
                                      "Mistral-Small-3.2-24B-Instruct-2506", "Qwen3-Coder"])
def test_no_thinking(template: str) -> None:
    path = TEMPLATES / f"{template}.jinja"
    if not path.exists():
        pytest.skip(f"{template} not copied")
    assert reasoning_parser_for(path.read_text(), set()) is None
    assert reasoning_parser_for(None, set()) is None
