"""The checks behind hitenter/server/limits.py, standalone: nothing here imports FastAPI or the engine,
so the body-check worker process (hitenter/server/body_check.py) runs them light. Every function takes
the ``Limits`` it checks against; a problem is a ``Refusal`` (status, message, param), which limits.py
raises as the server's ``APIError``.

- ``check_body`` / ``body_problem``: a request body (parsed / raw) against the list sizes, grammar input
  sizes and depth limits; ``deep_field``: where a body too deep for the JSON parser nests too deep.
- ``check_json`` / ``loads``, ``check_schema``, ``check_choices``, ``check_text``: one field's value.
- ``serve``: the body-check worker's loop.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
from dataclasses import dataclass
from typing import IO, Any


class Refusal(Exception):
    """A request over a limit: the HTTP status (400, or 413 for a grammar input over its size), the message
    naming the field and the limit, and the field."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


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


_STOPS = ("stop", "stop_sequences")
_MESSAGES = ("messages", "input")


def _deep(field: str, limit: int) -> Refusal:
    return Refusal(400, f"{field}: nested deeper than {limit} levels (the limit is {limit})", field)


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


def loads(text: str, field: str, lim: Limits, what: str = "not valid JSON") -> Any:
    """``json.loads`` of a string field, bounded: too deep for the parser or over ``max_json_depth`` is a 400."""
    try:
        value = json.loads(text)
    except RecursionError as e:
        raise _deep(field, lim.max_json_depth) from e
    except json.JSONDecodeError as e:
        raise Refusal(400, f"{field}: {what}: {e}", field) from e
    check_json(value, field, lim.max_json_depth)
    return value


def check_json(value: Any, field: str, limit: int) -> None:
    if depth_over(value, limit):
        raise _deep(field, limit)


def _count(field: str, n: int, limit: int, what: str, flag: str) -> None:
    if n > limit:
        raise Refusal(400, f"{field}: {n} {what}; the limit is {limit} ({flag})", field)


def check_body(body: Any, lim: Limits) -> None:
    """The request body's list sizes and grammar inputs (cheap ``len`` checks first), then its depth per
    top-level field; the first problem is a 400 (413 for a grammar input over its size)."""
    if not isinstance(body, dict):
        return
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
    check_grammar_inputs(body, lim)
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


def check_grammar_inputs(body: dict[str, Any], lim: Limits) -> None:
    """The grammar inputs of every surface's spelling, sized before the body is validated (so an oversized
    one costs one parse, not a parse, a validation and then the refusal); the same checks as guided.py's."""
    so = body.get("structured_outputs")
    for field, choices in (("guided_choice", body.get("guided_choice")), ("structured_outputs",
                                                                          _at(so, "choice"))):
        if isinstance(choices, list):
            check_choices(choices, field, lim)
    for field, kind, text in (("guided_regex", "regex", body.get("guided_regex")),
                              ("guided_grammar", "grammar", body.get("guided_grammar")),
                              ("structured_outputs", "regex", _at(so, "regex")),
                              ("structured_outputs", "grammar", _at(so, "grammar"))):
        if isinstance(text, str):
            check_text(text, kind, field, lim)
    rf, fmt = body.get("response_format"), body.get("format")
    schemas = [("guided_json", body.get("guided_json")), ("structured_outputs", _at(so, "json")),
               ("response_format", _at(rf, "schema")), ("response_format", _at(rf, "json_schema", "schema")),
               ("format", fmt if isinstance(fmt, dict) else None), ("text.format", _at(body, "text", "format", "schema")),
               ("output_config.format", _at(body, "output_config", "format", "schema"))]
    for field, schema in schemas:
        if isinstance(schema, dict):
            check_schema(schema, field, lim)


def _too_big(field: str, what: str, n: int, limit: int, flag: str) -> Refusal:
    return Refusal(413, f"{field}: {what} {n} is over the limit {limit} ({flag})", field)


def check_schema(schema: Any, field: str, lim: Limits) -> None:
    """A JSON schema's depth, node count, enum sizes and pattern lengths (what compilation cost grows with),
    in one walk that sizes a node before it looks at its children."""
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


def check_choices(choices: list[str], field: str, lim: Limits) -> None:
    if len(choices) > lim.max_guided_choices:
        raise _too_big(field, "choice count", len(choices), lim.max_guided_choices, "--max-guided-choices")
    total = sum(len(c) for c in choices if isinstance(c, str))
    if total > lim.max_guided_choice_chars:
        raise _too_big(field, "total choice length", total, lim.max_guided_choice_chars,
                       "--max-guided-choice-chars")


def check_text(text: str, kind: str, field: str, lim: Limits) -> None:
    """A regex (``max_pattern_chars``) or an EBNF grammar (``max_grammar_chars``)."""
    limit, flag = ((lim.max_pattern_chars, "--max-pattern-chars") if kind == "regex"
                   else (lim.max_grammar_chars, "--max-grammar-chars"))
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


def body_problem(body: bytes, lim: Limits) -> Refusal | None:
    """``check_body`` of a raw body: its Refusal, or None (also for malformed JSON: the app's own 400)."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except RecursionError:
        field, limit = deep_field(body, lim.max_json_depth + 8), lim.max_json_depth + 8
        return _deep(field, limit)
    except ValueError:
        return None                                     # malformed JSON: the app's own 400
    try:
        check_body(value, lim)
    except Refusal as e:
        return e
    return None


HEAD = struct.Struct("<II")          # the worker's framing: limits JSON length, body length
WORKER_NICE = 10                     # the worker runs this much below the server in CPU priority


def _read(inp: IO[bytes], n: int) -> bytes:
    data = inp.read(n)
    if len(data) < n:
        raise EOFError
    return data


def serve(inp: IO[bytes] | None = None, out: IO[bytes] | None = None) -> None:
    """The body-check worker's loop: a header, the limits as JSON and the body in; a verdict line (null or
    [status, message, param]) out; until its stdin closes (the server is gone)."""
    inp, out = inp or sys.stdin.buffer, out or sys.stdout.buffer
    os.nice(WORKER_NICE)
    while True:
        try:
            n_lim, n_body = HEAD.unpack(_read(inp, HEAD.size))
            lim = Limits(**json.loads(_read(inp, n_lim)))
            err = body_problem(_read(inp, n_body), lim)
        except EOFError:
            return
        out.write(json.dumps(None if err is None else [err.status, err.message, err.param]).encode() + b"\n")
        out.flush()
