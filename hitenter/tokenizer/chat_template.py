"""Chat templates: render a GGUF's `tokenizer.chat_template` (Jinja2) the way transformers does.

Contracts:
- `render_chat_template(template, messages, add_generation_prompt=True, **kwargs) -> str` gives the same text
  as transformers' `apply_chat_template(..., tokenize=False)`: an `ImmutableSandboxedEnvironment` (limited) with
  `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block that just
  renders its body, `raise_exception`, `strftime_now` and transformers' `tojson` filter; variables are
  `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools`, `documents` plus any kwargs.
- Bad input raises ValueError with a clear message: messages not a list, a message not a mapping, a missing or
  non-string role, missing content (allowed only alongside `tool_calls`), no template, or a template that
  calls `raise_exception` / fails to render.
- The template is a stranger's code: it compiles and renders under the limits of
  hitenter/tokenizer/template_limits.py (source size, time, steps, call depth, output size); going over one
  is a ValueError naming it, never a hang.
- `render_chat_segments(...)` renders the same text split into (text, is_markup) pieces, so that message
  content can be tokenized as plain text: a user's `<|im_end|>` never becomes the control token.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes

from hitenter.tokenizer.template_limits import LimitedEnvironment, TemplateLimitError, render_limited


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker): renders the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile (and cache) a chat template in the limited sandbox (hitenter/tokenizer/template_limits.py);
    a syntax error, an oversized source or one Jinja cannot parse raises ValueError."""
    env = LimitedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.finish_setup()
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the model's chat template is not valid Jinja (line {e.lineno}): {e.message}") from e
    except TemplateLimitError as e:
        raise ValueError(f"the model's chat template cannot be used: {e}") from e
    except (RecursionError, MemoryError, SyntaxError) as e:   # nesting deeper than Jinja's parser takes
        raise ValueError(f"the model's chat template cannot be compiled: {type(e).__name__}") from e


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the OpenAI-style message list and return plain-dict copies; ValueError names the bad entry."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of {{'role': ..., 'content': ...}} objects, "
                         f"got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must contain at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}] has no 'role' (expected a string such as 'user' or 'system')")
        if m.get("content") is None and not m.get("tool_calls"):
            raise ValueError(f"messages[{i}] (role {role!r}) has no 'content'")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(f"messages[{i}].content must be a string or a list of parts, "
                             f"got {type(content).__name__}")
        out.append(dict(m))
    return out


def render_chat_template(template: str | None, messages: Any, add_generation_prompt: bool = True,
                         bos_token: str = "", eos_token: str = "", **kwargs: Any) -> str:
    """Render `messages` through `template` (see module docstring); ValueError on bad input."""
    if not template:
        raise ValueError("this model has no chat template (tokenizer.chat_template); "
                         "send a plain prompt (completions) instead of chat messages")
    msgs = validate_messages(messages)
    compiled = compile_chat_template(template)
    kwargs.setdefault("tools", None)
    kwargs.setdefault("documents", None)
    try:
        return render_limited(compiled, messages=msgs, add_generation_prompt=add_generation_prompt,
                              bos_token=bos_token, eos_token=eos_token, **kwargs)
    except TemplateLimitError as e:
        raise ValueError(f"the model's chat template went over its limits: {e}") from e
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"the chat template rejected these messages: {e}") from e
    except Exception as e:   # the template's own arithmetic, recursion or lookups failing on this input
        raise ValueError(f"the chat template could not render these messages: {type(e).__name__}: {e}") from e


# ---- message content as text: only the template's own markup may produce control tokens ----------

Segment = tuple[str, bool]       # (text, is_markup): markup is tokenized with special tokens parsed


def _with_placeholders(msgs: list[dict[str, Any]], needs: Callable[[str], bool],
                       nonce: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Copies of ``msgs`` whose string contents for which ``needs(content)`` holds are replaced by
    unique placeholders (private-use characters and a random nonce: no template or user writes them)."""
    out, real = [], {}
    for i, m in enumerate(msgs):
        c = m.get("content")
        if isinstance(c, str) and needs(c):
            ph = f"\ue000{nonce}.{i}\ue001"
            real[ph] = c
            m = {**m, "content": ph}
        out.append(m)
    return out, real


def render_chat_segments(template: str | None, messages: Any, needs_protection: Callable[[str], bool],
                         add_generation_prompt: bool = True, **kwargs: Any) -> list[Segment]:
    """Render like :func:`render_chat_template`, split into markup and message content.

    Contents for which ``needs_protection`` is true (they contain special-token text) are rendered as
    placeholders first, and the text around them is the template's markup. The result is checked:
    putting the real contents back must give exactly the plain rendering; a template that transforms
    or branches on such a content cannot be split safely and raises ValueError. Contents that need no
    protection stay inside the markup segments, so their token ids are exactly those of the plain text.
    """
    plain = render_chat_template(template, messages, add_generation_prompt, **kwargs)
    msgs = validate_messages(messages)
    nonce = secrets.token_hex(6)
    guarded, real = _with_placeholders(msgs, needs_protection, nonce)
    if not real:
        return [(plain, True)]
    rendered = render_chat_template(template, guarded, add_generation_prompt, **kwargs)
    parts = re.split(f"(\ue000{nonce}\\.\\d+\ue001)", rendered)
    segments = [(real[p], False) if p in real else (p, True) for p in parts if p]
    if "".join(s for s, _ in segments) != plain:
        raise ValueError("a message content contains special-token text and this model's chat template "
                         "transforms message content, so it cannot be kept as plain text; remove the "
                         "special-token text from the message")
    return segments
