"""Bounded work for every request (issue 32): depth and size limits on nested input, checked without
recursion before anything recurses (pydantic, templates, xgrammar), and the size limits on the inputs
that drive grammar compilation. Each refusal is an ``APIError`` naming the field and the limit (400;
413 for a grammar input over its size limit), rendered in the API's own error shape.

- ``check_body``: the whole request body (``BoundedBodyMiddleware``, before FastAPI parses it): no value nested
  deeper than ``max_json_depth`` below its top-level field; at most ``max_stop`` stop strings,
  ``max_logit_bias`` logit_bias entries, ``max_tools`` tools and ``max_messages`` messages/items.
- ``check_json``: a JSON value parsed from a string (a ``guided_json`` string, tool-call arguments).
- ``check_schema``: a JSON schema before it is compiled: depth, nodes, ``enum`` sizes, ``pattern`` lengths.
- ``check_choices`` / ``check_text``: ``guided_choice`` and regex / EBNF sources.

The limits are flags of ``hitenter serve`` (hitenter/cli.py); ``LIMITS`` holds the process's values
(``create_app(limits=...)`` sets them)."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hitenter.server.api_error import APIError


@dataclass
class Limits:
    max_json_depth: int = 64            # levels below a top-level field (a schema's properties: 2 a level)
    max_schema_nodes: int = 10_000      # JSON values in one schema
    max_enum_values: int = 1024         # per enum, and all enums of a schema together x4
    max_pattern_chars: int = 1024       # a schema's pattern / format regex, and guided_regex
    max_grammar_chars: int = 65_536     # an EBNF grammar (guided_grammar, structured_outputs.grammar)
    max_guided_choices: int = 1024      # guided_choice / structured_outputs.choice entries
    max_guided_choice_chars: int = 65_536   # their total length
    max_stop: int = 64                  # stop strings (stop, stop_sequences, options.stop)
    max_logit_bias: int = 1024          # logit_bias entries
    max_tools: int = 256                # tool definitions
    max_messages: int = 16_384          # messages / input items
    max_grammar_compile_seconds: float = 5.0
    max_grammar_cache_bytes: int = 64 << 20


LIMITS = Limits()
_STOPS = ("stop", "stop_sequences")
_MESSAGES = ("messages", "input")


def configure(limits: Limits) -> None:
    """Set the process's limits (the grammar backend's time and cache bounds too)."""
    global LIMITS
    LIMITS = limits
    from hitenter.engine import structured
    structured.configure(limits.max_grammar_compile_seconds, limits.max_grammar_cache_bytes)


def _deep(field: str, limit: int) -> APIError:
    return APIError(400, f"{field}: nested deeper than {limit} levels (the limit is {limit})", field)


def depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` levels (a scalar is 0, ``[]`` 1, ``[[]]`` 2); no recursion."""
    stack = [(value, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        if d + 1 > limit:
            return True
        stack.extend((v, d + 1) for v in node if isinstance(v, dict | list))
    return False


def loads(text: str, field: str, what: str = "not valid JSON") -> Any:
    """``json.loads`` of a string field, bounded: too deep for the parser or over ``max_json_depth`` is a 400."""
    try:
        value = json.loads(text)
    except RecursionError as e:
        raise _deep(field, LIMITS.max_json_depth) from e
    except json.JSONDecodeError as e:
        raise APIError(400, f"{field}: {what}: {e}", field) from e
    check_json(value, field)
    return value


def check_json(value: Any, field: str, limit: int | None = None) -> None:
    limit = LIMITS.max_json_depth if limit is None else limit
    if depth_over(value, limit):
        raise _deep(field, limit)


def _count(field: str, n: int, limit: int, what: str, flag: str) -> None:
    if n > limit:
        raise APIError(400, f"{field}: {n} {what}; the limit is {limit} ({flag})", field)


def check_body(body: Any) -> None:
    """The request body's list sizes and grammar inputs (cheap ``len`` checks first), then its depth per
    top-level field; the first problem is a 400 (413 for a grammar input over its size)."""
    if not isinstance(body, dict):
        return
    lim = LIMITS
    for scope, prefix in ((body, ""), (body.get("options"), "options.")):
        if not isinstance(scope, dict):
            continue
        for key in _STOPS:
            if isinstance(scope.get(key), list):
                _count(prefix + key, len(scope[key]), lim.max_stop, "stop strings", "--max-stop")
        if isinstance(scope.get("logit_bias"), dict):
            _count(prefix + "logit_bias", len(scope["logit_bias"]), lim.max_logit_bias, "entries",
                   "--max-logit-bias")
    if isinstance(body.get("tools"), list):
        _count("tools", len(body["tools"]), lim.max_tools, "tools", "--max-tools")
    for key in _MESSAGES:
        if isinstance(body.get(key), list):
            _count(key, len(body[key]), lim.max_messages, "items", "--max-messages")
    check_grammar_inputs(body)
    for key, value in body.items():
        field = str(key)
        if depth_over(value, lim.max_json_depth + 8):        # + the envelope around a schema or arguments
            raise _deep(field, lim.max_json_depth + 8)


def _at(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(k)
    return obj


def check_grammar_inputs(body: dict[str, Any]) -> None:
    """The grammar inputs of every surface's spelling, sized before the body is validated (so an oversized
    one costs one parse, not a parse, a validation and then the refusal); the same checks as guided.py's."""
    so = body.get("structured_outputs")
    for field, choices in (("guided_choice", body.get("guided_choice")), ("structured_outputs",
                                                                          _at(so, "choice"))):
        if isinstance(choices, list):
            check_choices(choices, field)
    for field, kind, text in (("guided_regex", "regex", body.get("guided_regex")),
                              ("guided_grammar", "grammar", body.get("guided_grammar")),
                              ("structured_outputs", "regex", _at(so, "regex")),
                              ("structured_outputs", "grammar", _at(so, "grammar"))):
        if isinstance(text, str):
            check_text(text, kind, field)
    rf, fmt = body.get("response_format"), body.get("format")
    schemas = [("guided_json", body.get("guided_json")), ("structured_outputs", _at(so, "json")),
               ("response_format", _at(rf, "schema")), ("response_format", _at(rf, "json_schema", "schema")),
               ("format", fmt if isinstance(fmt, dict) else None), ("text.format", _at(body, "text", "format", "schema")),
               ("output_config.format", _at(body, "output_config", "format", "schema"))]
    for field, schema in schemas:
        if isinstance(schema, dict):
            check_schema(schema, field)


def _too_big(field: str, what: str, n: int, limit: int, flag: str) -> APIError:
    return APIError(413, f"{field}: {what} {n} is over the limit {limit} ({flag})", field)


def check_schema(schema: Any, field: str) -> None:
    """A JSON schema's depth, node count, enum sizes and pattern lengths (what compilation cost grows with),
    in one walk that sizes a node before it looks at its children."""
    lim = LIMITS
    nodes = enum_total = 0
    stack = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > lim.max_schema_nodes:
            raise _too_big(field, "schema size (JSON values)", nodes, lim.max_schema_nodes, "--max-schema-nodes")
        if isinstance(node, dict):
            enum = node.get("enum")
            if isinstance(enum, list):
                if len(enum) > lim.max_enum_values:
                    raise _too_big(field, "enum size", len(enum), lim.max_enum_values, "--max-enum-values")
                enum_total += len(enum)
                if enum_total > 4 * lim.max_enum_values:
                    raise _too_big(field, "enum values in all", enum_total, 4 * lim.max_enum_values,
                                   "--max-enum-values x4")
            for key in ("pattern", "format"):
                v = node.get(key)
                if isinstance(v, str) and len(v) > lim.max_pattern_chars:
                    raise _too_big(field, f"{key} length", len(v), lim.max_pattern_chars, "--max-pattern-chars")
            pp = node.get("patternProperties")
            if isinstance(pp, dict):
                for k in pp:
                    if len(k) > lim.max_pattern_chars:
                        raise _too_big(field, "patternProperties key length", len(k), lim.max_pattern_chars,
                                       "--max-pattern-chars")
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth + 1 > lim.max_json_depth:
            raise _deep(field, lim.max_json_depth)
        if len(children) > lim.max_schema_nodes:
            raise _too_big(field, "schema size (JSON values)", len(children), lim.max_schema_nodes,
                           "--max-schema-nodes")
        for v in children:
            if isinstance(v, dict | list):
                stack.append((v, depth + 1))
            elif isinstance(v, str) and len(v) > lim.max_guided_choice_chars:
                raise _too_big(field, "a string of length", len(v), lim.max_guided_choice_chars,
                               "--max-guided-choice-chars")
            else:
                nodes += 1


def check_choices(choices: list[str], field: str) -> None:
    lim = LIMITS
    if len(choices) > lim.max_guided_choices:
        raise _too_big(field, "choice count", len(choices), lim.max_guided_choices, "--max-guided-choices")
    total = sum(len(c) for c in choices if isinstance(c, str))
    if total > lim.max_guided_choice_chars:
        raise _too_big(field, "total choice length", total, lim.max_guided_choice_chars,
                       "--max-guided-choice-chars")


def check_text(text: str, kind: str, field: str) -> None:
    """A regex (``max_pattern_chars``) or an EBNF grammar (``max_grammar_chars``)."""
    limit, flag = ((LIMITS.max_pattern_chars, "--max-pattern-chars") if kind == "regex"
                   else (LIMITS.max_grammar_chars, "--max-grammar-chars"))
    if len(text) > limit:
        raise _too_big(field, f"{kind} length", len(text), limit, flag)


_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def deep_field(body: bytes, limit: int) -> str:
    """The top-level key under which ``body`` (JSON the parser found too deep) first nests past ``limit``,
    found by a scan of its brackets and strings that stops there ("body" when at the top)."""
    depth, key, last = 0, "body", b""
    for m in _TOKENS.finditer(body):
        tok = m.group()
        if tok[:1] == b'"':
            if depth == 1:
                last = tok
            continue
        if tok in (b"[", b"{"):
            if depth == 1 and last:
                try:
                    key = str(json.loads(last))
                except ValueError:
                    key = "body"
            depth += 1
            if depth > limit:
                return key
        else:
            depth -= 1
    return key


class BoundedBodyMiddleware:
    """``check_body`` on the JSON body of every POST under ``prefixes``, before the app parses it: the body
    is read (its size is already bounded by BodyLimitMiddleware, outside this one), parsed once here,
    checked, and replayed to the app. A body too deep for the JSON parser itself is refused naming its
    field, as is one over the limits; the error is in the API's own shape (by path)."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...]) -> None:
        self.app, self.prefixes = app, prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        try:
            while more:
                msg = await receive()
                if msg["type"] != "http.request":
                    return                              # the client left
                chunks.append(msg.get("body", b""))
                more = msg.get("more_body", False)
        except HTTPException as e:                      # the body limit (413), raised from its receive
            await APIError(e.status_code, str(e.detail), headers=dict(e.headers or {})).response(path)(
                scope, receive, send)
            return
        body = b"".join(chunks)
        problem = await asyncio.to_thread(_problem, body) if len(body) > 1 << 16 else _problem(body)
        if problem is not None:
            await problem.response(path)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _problem(body: bytes) -> APIError | None:
    if not body:
        return None
    try:
        value = json.loads(body)
    except RecursionError:
        field, limit = deep_field(body, LIMITS.max_json_depth + 8), LIMITS.max_json_depth + 8
        return _deep(field, limit)
    except ValueError:
        return None                                     # malformed JSON: the app's own 400
    try:
        check_body(value)
    except APIError as e:
        return e
    return None
