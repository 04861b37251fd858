"""Chat-template rendering: transformers-compatible environment, message validation, clear errors.
(The real models' templates are checked against transformers-rendered goldens in tests/tokenizer/test_tokenizer.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hitenter.tokenizer.chat_template import compile_chat_template, render_chat_template, validate_messages

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Exercises trim_blocks / lstrip_blocks, tojson, loop controls, bos/eos, generation blocks, raise_exception.
TRICKY = """{{ bos_token }}
{% if tools %}
    Tools: {{ tools | tojson }}
{% endif %}
{% for m in messages %}
    {% if m['role'] == 'bad' %}{{ raise_exception('role bad is not allowed') }}{% endif %}
    {% if m['role'] == 'skip' %}{% continue %}{% endif %}
    {% if m['role'] == 'assistant' %}
        {% generation %}A: {{ m['content'] }}{{ eos_token }}{% endgeneration %}
    {% else %}
        {{ m['role'] }}: {{ m['content'] | tojson }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}A:{% endif %}"""
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ünïcode \"q\" 数"},
        {"role": "skip", "content": "x"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]


def test_chatml() -> None:
    out = render_chat_template(CHATML, [{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat_template(CHATML, [{"role": "user", "content": "hi"}], add_generation_prompt=False) == \
        "<|im_start|>user\nhi<|im_end|>\n"


def test_tricky_template_expected_text() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    out = render_chat_template(TRICKY, MSGS, bos_token="<s>", eos_token="</s>", tools=tools)
    assert out == ('<s>\n    Tools: [{"type": "function", "function": {"name": "f", "parameters": {}}}]\n'
                   '        system: "Be brief."\n        user: "Ünïcode \\"q\\" 数"\nA: ok</s>        user: "more"\nA:')


def test_matches_transformers_rendering() -> None:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>",
                                               eos_token="</s>")
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]
    for template in (CHATML, TRICKY):
        for gen in (True, False):
            want = tok.apply_chat_template(MSGS, chat_template=template, add_generation_prompt=gen, tokenize=False,
                                           tools=tools if template is TRICKY else None)
            got = render_chat_template(template, MSGS, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>",
                                       tools=tools if template is TRICKY else None)
            assert got == want


def test_helpers() -> None:
    out = render_chat_template("{{ strftime_now('%Y') }}|{{ messages | tojson(indent=1) }}", [{"role": "u", "content": "c"}])
    year, js = out.split("|", 1)
    assert year.isdigit() and len(year) == 4
    assert json.loads(js) == [{"role": "u", "content": "c"}]
    assert compile_chat_template(CHATML) is compile_chat_template(CHATML)  # cached


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ("hello", "must be a list"),
        ({"role": "user", "content": "x"}, "must be a list"),
        (None, "must be a list"),
        ([], "at least one"),
        (["hi"], r"messages\[0\] must be an object"),
        ([{"content": "x"}], r"messages\[0\] has no 'role'"),
        ([{"role": "user", "content": "a"}, {"role": 3, "content": "x"}], r"messages\[1\] has no 'role'"),
        ([{"role": "user"}], r"messages\[0\] \(role 'user'\) has no 'content'"),
        ([{"role": "user", "content": 5}], r"content must be a string"),
    ],
)
def test_bad_messages(messages: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        render_chat_template(CHATML, messages)


def test_tool_call_message_without_content_is_allowed() -> None:
    msgs = validate_messages([{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}])
    assert msgs[0]["tool_calls"] == [{"id": "1"}]


def test_template_errors_become_value_errors() -> None:
    with pytest.raises(ValueError, match="role bad is not allowed"):
        render_chat_template(TRICKY, [{"role": "bad", "content": "x"}])
    with pytest.raises(ValueError, match="not valid Jinja"):
        render_chat_template("{% for %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="no chat template"):
        render_chat_template(None, [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="could not render|rejected"):
        render_chat_template("{{ messages[0]['content'] + 1 }}", [{"role": "user", "content": "x"}])


def test_sandbox_blocks_unsafe_access() -> None:
    with pytest.raises(ValueError):
        render_chat_template("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
                             [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError):  # immutable sandbox: no mutating the caller's data
        render_chat_template("{{ messages.append(1) }}", [{"role": "user", "content": "x"}])
