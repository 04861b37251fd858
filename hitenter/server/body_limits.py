"""Bounded work for every request: the depth and size limits on request bodies and on the
inputs that drive grammar compilation, checked without recursion before anything recurses (pydantic,
templates, xgrammar), and the worker process that checks large bodies. Each problem is a ``Refusal``
(status, message naming the field and the limit, param): 400, or 413 for a grammar input over its size
limit; the server renders it as its ``APIError``, in the API's own shape.

This module imports neither FastAPI nor torch (nor the rest of the server): the body-check worker runs it
alone, and ``hitenter serve --help`` reads ``Limits`` from it.

- ``Limits``: the bounds, flags of ``hitenter serve`` (hitenter/cli.py); ``LIMITS`` holds the process's
  values (``create_app(limits=...)`` calls ``configure``).
- ``body_problem(body)``: a raw body against LIMITS: no value nested deeper than ``max_json_depth`` below
  its top-level field; at most ``max_stop`` stop strings, ``max_logit_bias`` logit_bias entries,
  ``max_tools`` tools and ``max_messages`` messages/items; the grammar inputs within their sizes.
  ``problem(body, client)``: the same, large bodies checked in the worker (below); middleware.py's
  ``BoundedBodyMiddleware`` calls it on every API body before FastAPI parses it.
- ``loads_within``, ``check_schema_within``, ``check_choices_within``, ``check_text_within``: one field's
  value (a ``guided_json`` string, tool-call arguments, a schema before it is compiled, ``guided_choice``,
  regex / EBNF sources) against given ``Limits``, raising a ``Refusal`` (field_limits.py: the same against
  LIMITS, raised as the server's ``APIError``).
- ``depth_over`` / ``deep_field``: how deep a value nests; where a body too deep for the JSON parser does.

Why a worker: ``json.loads`` is one C call that holds the GIL for its whole length (tens of milliseconds
for a megabyte body), and the GIL is what the engine thread and the event loop need to keep decoding and
streaming: a client looping refused megabyte grammars would hold it much of the time and slow every
stream. The worker (one, started when the app first runs, ``WORKER_NICE``
below the server's CPU priority, in its own session so a terminal's Ctrl-C is the server's alone) parses
and checks (``serve``); the server only writes the bytes down a pipe (GIL released) from one helper thread
and reads a one-line verdict. The app still parses the bodies that pass, itself.

- ``BodyChecker.problem(body)``: bodies up to ``INLINE_BYTES`` are checked in place (well under a
  millisecond), larger ones in the worker. At most ``MAX_PENDING`` large bodies wait for it at once; one
  more is a 429. A worker that dies (or is silent ``STUCK_S`` on one body) is started again on the next
  body, and the body it failed on is checked in the helper thread instead (never a 5xx).
- ``RefusalPacer``: a client (by address) whose large bodies keep being refused (more than ``PACE_FREE``
  in ``PACE_WINDOW_S``) gets each further refusal ``PACE_DELAY_S`` late: one client looping refused 1 MB
  grammars then costs the server a few refusals a second, not dozens (each still costs the server's
  interpreter the time to receive the body); its answers stay the same 4xx, within a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import IO, Any

from hitenter import envs


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


def loads_within(text: str, field: str, lim: Limits, what: str = "not valid JSON") -> Any:
    """``json.loads`` of a string field, bounded: too deep for the parser or over ``max_json_depth`` is a 400."""
    try:
        value = json.loads(text)
    except RecursionError as e:
        raise _deep(field, lim.max_json_depth) from e
    except json.JSONDecodeError as e:
        raise Refusal(400, f"{field}: {what}: {e}", field) from e
    _check_json(value, field, lim.max_json_depth)
    return value


def _check_json(value: Any, field: str, limit: int) -> None:
    if depth_over(value, limit):
        raise _deep(field, limit)


def _count(field: str, n: int, limit: int, what: str, flag: str) -> None:
    if n > limit:
        raise Refusal(400, f"{field}: {n} {what}; the limit is {limit} ({flag})", field)


def _check_body(body: Any, lim: Limits) -> None:
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
    _check_grammar_inputs(body, lim)
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


def _check_grammar_inputs(body: dict[str, Any], lim: Limits) -> None:
    """The grammar inputs of every surface's spelling, sized before the body is validated (so an oversized
    one costs one parse, not a parse, a validation and then the refusal); the same checks as structured_fields.py's."""
    so = body.get("structured_outputs")
    for field, choices in (("guided_choice", body.get("guided_choice")), ("structured_outputs",
                                                                          _at(so, "choice"))):
        if isinstance(choices, list):
            check_choices_within(choices, field, lim)
    for field, kind, text in (("guided_regex", "regex", body.get("guided_regex")),
                              ("guided_grammar", "grammar", body.get("guided_grammar")),
                              ("structured_outputs", "regex", _at(so, "regex")),
                              ("structured_outputs", "grammar", _at(so, "grammar"))):
        if isinstance(text, str):
            check_text_within(text, kind, field, lim)
    rf, fmt = body.get("response_format"), body.get("format")
    schemas = [("guided_json", body.get("guided_json")), ("structured_outputs", _at(so, "json")),
               ("response_format", _at(rf, "schema")), ("response_format", _at(rf, "json_schema", "schema")),
               ("format", fmt if isinstance(fmt, dict) else None), ("text.format", _at(body, "text", "format", "schema")),
               ("output_config.format", _at(body, "output_config", "format", "schema"))]
    for field, schema in schemas:
        if isinstance(schema, dict):
            check_schema_within(schema, field, lim)


def _too_big(field: str, what: str, n: int, limit: int, flag: str) -> Refusal:
    return Refusal(413, f"{field}: {what} {n} is over the limit {limit} ({flag})", field)


def check_schema_within(schema: Any, field: str, lim: Limits) -> None:
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


def check_choices_within(choices: list[str], field: str, lim: Limits) -> None:
    if len(choices) > lim.max_guided_choices:
        raise _too_big(field, "choice count", len(choices), lim.max_guided_choices, "--max-guided-choices")
    total = sum(len(c) for c in choices if isinstance(c, str))
    if total > lim.max_guided_choice_chars:
        raise _too_big(field, "total choice length", total, lim.max_guided_choice_chars,
                       "--max-guided-choice-chars")


def check_text_within(text: str, kind: str, field: str, lim: Limits) -> None:
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


def _body_problem(body: bytes, lim: Limits) -> Refusal | None:
    """``_check_body`` of a raw body: its Refusal, or None (also for malformed JSON: the app's own 400)."""
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
        _check_body(value, lim)
    except Refusal as e:
        return e
    return None


# --- the process's limits --------------------------------------------------------------------------------

LIMITS = Limits()


def configure(limits: Limits) -> None:
    """Set the process's limits (the grammar backend's time and cache bounds too)."""
    global LIMITS
    LIMITS = limits
    from hitenter.engine import structured  # the engine: only once a server configures it
    structured.configure(limits.max_grammar_compile_seconds, limits.max_grammar_cache_bytes)


def body_problem(body: bytes) -> Refusal | None:
    """The raw body's problem against the process's LIMITS (None also for malformed JSON: the app's 400)."""
    return _body_problem(body, LIMITS)


# --- large bodies: the worker process, and the server's side of it ----------------------------------------

INLINE_BYTES = 1 << 16
MAX_PENDING = 16
STUCK_S = 30.0                        # a worker silent this long on one body is replaced
PACE_FREE, PACE_WINDOW_S, PACE_DELAY_S = 8, 10.0, 0.5
_PACE_CLIENTS = 4096                  # addresses remembered, least recently refused out
_WORKER = "from hitenter.server.body_limits import serve; serve()"
_SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
            err = _body_problem(_read(inp, n_body), lim)
        except EOFError:
            return
        out.write(json.dumps(None if err is None else [err.status, err.message, err.param]).encode() + b"\n")
        out.flush()


class BodyChecker:
    """One worker process and the helper thread that talks to it (see the module's docstring)."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="body-check")
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.pending = 0

    def warm(self) -> None:
        """Start the worker now (in the helper thread), so the first large body does not wait for it."""
        self._thread.submit(self._worker)

    async def problem(self, body: bytes) -> Refusal | None:
        if len(body) <= INLINE_BYTES:
            return body_problem(body)
        if self.pending >= MAX_PENDING:                   # answered with Retry-After: 1 (a 429's header)
            return Refusal(429, f"too many large request bodies ({MAX_PENDING}) are being checked; retry")
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, self._check, body)
        finally:
            self.pending -= 1

    @property
    def worker_pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _worker(self) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                env = envs.child_env(pythonpath_first=_SRC)
                self._proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, env=env, start_new_session=True)
            return self._proc

    def _check(self, body: bytes) -> Refusal | None:
        lim = json.dumps(asdict(LIMITS)).encode()
        try:
            proc = self._worker()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(HEAD.pack(len(lim), len(body)) + lim)
            proc.stdin.write(body)
            proc.stdin.flush()
            if not select.select([proc.stdout], [], [], STUCK_S)[0]:
                raise OSError("the body-check worker is stuck")
            verdict = json.loads(proc.stdout.readline())
        except (OSError, ValueError):                 # the worker died (killed, out of memory): check it here
            self._stop()
            return body_problem(body)
        return None if verdict is None else Refusal(verdict[0], verdict[1], verdict[2])

    def _stop(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.kill()
                self._proc.wait()
                self._proc = None


class RefusalPacer:
    """How late a client's refusal is answered: 0 for its first `free` in `window_s`, then `delay_s`
    (defaults ``PACE_FREE``, ``PACE_WINDOW_S``, ``PACE_DELAY_S``; event-loop state: called from the loop only)."""

    def __init__(self, free: int = PACE_FREE, window_s: float = PACE_WINDOW_S, delay_s: float = PACE_DELAY_S) -> None:
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()
        self.free, self.window_s, self.delay_s = free, window_s, delay_s

    def delay(self, client: str) -> float:
        now = time.monotonic()
        times = self._seen.pop(client, None) or deque(maxlen=self.free + 1)
        times.append(now)
        self._seen[client] = times
        while len(self._seen) > _PACE_CLIENTS:
            self._seen.popitem(last=False)
        return self.delay_s if len(times) > self.free and now - times[0] < self.window_s else 0.0


CHECKER, PACER = BodyChecker(), RefusalPacer()


async def problem(body: bytes, client: str = "") -> Refusal | None:
    """The body's limits problem against the process's LIMITS, large bodies checked in the worker; a
    large body's refusal paced by ``client`` (its address)."""
    err = await CHECKER.problem(body)
    if err is not None and len(body) > INLINE_BYTES:
        delay = PACER.delay(client)
        if delay:
            await asyncio.sleep(delay)
    return err
