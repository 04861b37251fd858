"""A chat template from a model file renders under limits (hitenter/tokenizer/template_limits.py): each
hostile template below is a ValueError naming what went wrong, quickly, never a hang, a MemoryError, a
RecursionError or a 5xx-bound exception; real templates render as before (tests/tokenizer/test_chat_template.py)."""

from __future__ import annotations

import time

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hitenter.testing.gguf_fuzz import HOSTILE_TEMPLATES
from hitenter.tokenizer import template_limits
from hitenter.tokenizer.chat_template import render_chat_template

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("template", HOSTILE_TEMPLATES, ids=lambda t: t[:40])
def test_a_hostile_template_is_a_value_error(template: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_limits, "MAX_STEPS", 200_000)   # the same checks, a smaller step budget
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="chat template") as ei:
        render_chat_template(template, HI)
    assert "\n" not in str(ei.value)
    assert time.monotonic() - t0 < 3.0, (template[:40], time.monotonic() - t0)


@pytest.mark.parametrize("template, words", [
    ("{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}", "steps"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested calls more than 64 deep"),
    ("{{ 'x' * 10**10 }}", "repeated sequence"),
    ("{{ 'x'.center(10**10) }}", "passed the number 10000000000"),
    ("{{ 7 ** 999999 }}", "power over 4096 bits"),
    ("{{ '%0999999999d' % 1 }}", "width or precision"),
    ("{{ ('{:>99999}' * 9999).format(*range(9999)) }}", "formatted string"),
    ("{{ ('\\n' * 60000)|indent(60000) }}", "indented string"),
    ("{{ ('ab' * 60000)|replace('a', 'x' * 60000) }}", "replaced string"),
    ("{{ (['ab' * 30000] * 60000)|join }}", "text|joined string"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "built a value"),
    ("{% for i in range(60000) %}{{ 'abcdefghij' * 1000 }}{% endfor %}", "wrote more than"),
    ("x" * (300 * 1024), "characters, over 262144"),
])
def test_each_limit_names_itself(template: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        render_chat_template(template, HI)


def test_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_limits, "MAX_RENDER_SECONDS", 0.2)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="more than 0.2 s"):
        render_chat_template("{% for i in range(60000) %}{{ messages|tojson }}{% endfor %}", HI * 50)
    assert time.monotonic() - t0 < 1.5


def test_ordinary_templates_render_as_in_the_stock_sandbox() -> None:
    """The guards change no output: the same text as jinja2's own ImmutableSandboxedEnvironment."""
    t = ("{% for m in messages %}{{ '<|' ~ m.role ~ '|>' }}{{ m.content|trim }}{% if not loop.last %}\n"
         "{% endif %}{% endfor %}{{ ('%s-%d' % ('x', 3)) ~ '{}|{:>4}'.format('a', 'b') ~ ['a', 'b']|join(',') }}"
         "{{ ('ab' * 3)|replace('a', 'c') ~ ('l1\\nl2'|indent(2)) ~ 2 ** 10 ~ range(3)|list|length }}"
         "{% macro f(n) %}{{ n }}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}")
    msgs = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    stock = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    want = stock.from_string(t).render(messages=msgs, add_generation_prompt=True, bos_token="", eos_token="",
                                       tools=None, documents=None)
    assert render_chat_template(t, msgs) == want
    assert "yox-3a|   ba,bcbcbcbl1\n  l21024" in want and want.endswith("3543210")
