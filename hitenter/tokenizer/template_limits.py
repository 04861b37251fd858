"""The limits a chat template from a model file renders under.

A GGUF's `tokenizer.chat_template` is code from a stranger. `LimitedEnvironment` is Jinja's
`ImmutableSandboxedEnvironment` (no attribute escapes, no mutation of lists and dicts) with a budget on
every render (`render_limited`):

- the source is at most MAX_TEMPLATE_CHARS; deeply nested source that Jinja's parser cannot take is a
  compile error, not a crash;
- a render may take at most MAX_RENDER_SECONDS, MAX_STEPS steps (loop iterations, calls, filters,
  intercepted operators) and MAX_CALL_DEPTH nested calls (macro recursion);
- every string it produces counts against MAX_WORK_CHARS, the text it outputs against MAX_OUTPUT_CHARS;
- operations that could allocate far past the budget in one step are checked before they run: `*` of a
  sequence, `**`, `%` and str.format with a width or many fields, str/filter calls with an integer argument
  over MAX_INT_ARG, `replace`, `indent` and `join` whose result would exceed MAX_OUTPUT_CHARS; constant
  folding at compile time is off (it would run them unchecked).

Going over any limit raises TemplateLimitError (a jinja2 TemplateError) naming the limit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import wraps
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_TEMPLATE_CHARS = 256 * 1024
MAX_OUTPUT_CHARS = 16 * 1024 * 1024
MAX_WORK_CHARS = 64 * 1024 * 1024
MAX_STEPS = 2_000_000
MAX_CALL_DEPTH = 64
MAX_RENDER_SECONDS = 5.0
MAX_INT_ARG = 1 << 16
_BIG_NUMBER = re.compile(r"\d{6,}")


class TemplateLimitError(jinja2.exceptions.TemplateError):
    """A chat template went over one of its limits (size, time, steps, depth, output)."""


@dataclass
class _Budget:
    deadline: float
    steps: int = 0
    work: int = 0
    output: int = 0
    depth: int = 0


_BUDGET: ContextVar[_Budget | None] = ContextVar("hitenter_template_budget", default=None)


def _budget() -> _Budget:
    b = _BUDGET.get()
    if b is None:   # a template rendered outside render_limited still gets a budget of its own
        b = _Budget(time.monotonic() + MAX_RENDER_SECONDS)
        _BUDGET.set(b)
    return b


def _step(n: int = 1) -> _Budget:
    b = _budget()
    b.steps += n
    if b.steps > MAX_STEPS:
        raise TemplateLimitError(f"the chat template took more than {MAX_STEPS} steps")
    if time.monotonic() > b.deadline:
        raise TemplateLimitError(f"the chat template took more than {MAX_RENDER_SECONDS:g} s to render")
    return b


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _charge(value: Any) -> Any:
    """Count a produced value's length against the work budget."""
    n = _size(value)
    if n > MAX_OUTPUT_CHARS:
        raise TemplateLimitError(f"the chat template built a value of {n} items, over {MAX_OUTPUT_CHARS}")
    if n:
        b = _budget()
        b.work += n
        if b.work > MAX_WORK_CHARS:
            raise TemplateLimitError(f"the chat template produced more than {MAX_WORK_CHARS} characters in all")
    return value


def _refuse_over(n: int, what: str) -> None:
    if n > MAX_OUTPUT_CHARS:
        raise TemplateLimitError(f"the chat template asked for {what} of {n} items, over {MAX_OUTPUT_CHARS}")


def _check_int_args(args: Iterable[Any]) -> None:
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
            raise TemplateLimitError(f"the chat template passed the number {a} to a call, over {MAX_INT_ARG}")


def _check_format(fmt: str, args: Any) -> None:
    """A %-format or str.format whose widths or repeated fields could build a huge string."""
    if _BIG_NUMBER.search(fmt):
        raise TemplateLimitError("the chat template formats with a width or precision of 6 or more digits")
    values = args.values() if isinstance(args, dict) else args if isinstance(args, tuple | list) else (args,)
    longest = max((_size(v) for v in values), default=0)
    widest = max((int(m) for m in re.findall(r"\d+", fmt)), default=0)
    _refuse_over(len(fmt) + (fmt.count("%") + fmt.count("{")) * (longest + widest), "a formatted string")


def _str_join_size(sep: str, items: list[Any]) -> int:
    return sum(_size(x) for x in items) + len(sep) * max(len(items) - 1, 0)


def _precheck_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Checks before a call from the template runs (see the module docstring); may return new args."""
    _check_int_args((*args, *kwargs.values()))
    target = getattr(obj, "__wrapped__", obj)    # the sandbox hands str.format over as a wrapper
    owner = getattr(target, "__self__", None)
    name = getattr(target, "__name__", "")
    if isinstance(owner, str):
        if name == "join" and args:
            items = _materialize(args[0])
            _refuse_over(_str_join_size(owner, items), "a joined string")
            return (items, *args[1:])
        if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            hits = owner.count(args[0]) if args[0] else len(owner) + 1
            _refuse_over(len(owner) + hits * len(args[1]), "a replaced string")
    if name in ("format", "format_map") and isinstance(owner, str):
        _check_format(owner, args[0] if name == "format_map" and args else args)
    return args


def _materialize(value: Any) -> list[Any]:
    items = []
    for x in value:
        _step()
        items.append(x)
    return items


_PASSED = (jinja2.runtime.Context, jinja2.nodes.EvalContext, jinja2.Environment)   # pass_context & co


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` (a filter) under the budget: its arguments checked first, its result charged."""

    @wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _step()
        plain = [a for a in args if not isinstance(a, _PASSED)]
        _check_int_args((*plain[1:], *kwargs.values()))
        value = plain[0] if plain else None
        if name == "join" and value is not None and not isinstance(value, str | jinja2.Undefined):
            items = _materialize(value)
            sep = plain[1] if len(plain) > 1 and isinstance(plain[1], str) else kwargs.get("d", "")
            _refuse_over(_str_join_size(str(sep), items), "a joined string")
            args = tuple(items if a is value else a for a in args)
        elif name == "indent" and isinstance(value, str):
            width = plain[1] if len(plain) > 1 else kwargs.get("width", 4)
            per_line = width if isinstance(width, int) else _size(width)
            _refuse_over(len(value) + (value.count("\n") + 1) * max(per_line, 0), "an indented string")
        elif name == "format" and isinstance(value, str):
            _check_format(value, kwargs or tuple(plain[1:]))
        elif name == "replace" and isinstance(value, str) and len(plain) >= 3:
            old, new = str(plain[1]), str(plain[2])
            hits = value.count(old) if old else len(value) + 1
            _refuse_over(len(value) + hits * len(new), "a replaced string")
        return _charge(func(*args, **kwargs))

    return guarded


def _guarded_iter(value: Any) -> Iterator[Any]:
    """A for-loop's iterable, one step per iteration."""
    if isinstance(value, jinja2.Undefined):
        yield from value
        return
    for x in value:
        _step()
        yield x


def _guarded_output(value: Any) -> Any:
    """A value written to the output (or a block's buffer), counted against the output budget."""
    b = _step()
    n = len(value) if isinstance(value, str) else 0
    b.output += n
    if b.output > MAX_OUTPUT_CHARS:
        raise TemplateLimitError(f"the chat template wrote more than {MAX_OUTPUT_CHARS} characters")
    return _charge(value) if n else value


_ITER, _SIZE, _OUT = "__hitenter_iter", "__hitenter_size", "__hitenter_out"


class _InsertGuards(NodeTransformer):
    """Every for-loop iterable through _guarded_iter, every concatenation (`~`) charged, every output
    expression through _guarded_output."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _ITER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(node, _SIZE, [], [], None, None, lineno=node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [n if isinstance(n, nodes.TemplateData) else
                      nodes.Filter(n, _OUT, [], [], None, None, lineno=n.lineno) for n in node.nodes]
        return node


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with the budget of the module docstring."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(optimized=False, **kwargs)

    def finish_setup(self) -> None:
        """Wrap every filter (call after adding the caller's own filters)."""
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.filters[_ITER] = _guarded_iter
        self.filters[_SIZE] = _charge
        self.filters[_OUT] = _guarded_output

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TemplateLimitError(f"the chat template has {len(source)} characters, over {MAX_TEMPLATE_CHARS}")
        return _InsertGuards().visit(super()._parse(source, name, filename))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _step()
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(n, int) and _size(seq):
                _refuse_over(_size(seq) * max(n, 0), "a repeated sequence")
                if isinstance(seq, list | tuple):
                    _refuse_over(sum(_size(x) for x in seq) * max(n, 0), "a repeated sequence's text")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                    right * abs(left).bit_length() > 4096:
                raise TemplateLimitError("the chat template raised a number to a power over 4096 bits")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right)
        return _charge(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        b = _step()
        args = _precheck_call(__obj, args, kwargs)
        if b.depth >= MAX_CALL_DEPTH:
            raise TemplateLimitError(f"the chat template nested calls more than {MAX_CALL_DEPTH} deep")
        b.depth += 1
        try:
            return _charge(super().call(__context, __obj, *args, **kwargs))
        finally:
            b.depth -= 1


def render_limited(template: jinja2.Template, **variables: Any) -> str:
    """`template` rendered with a fresh budget (the limits of the module docstring)."""
    token = _BUDGET.set(_Budget(time.monotonic() + MAX_RENDER_SECONDS))
    try:
        return template.render(**variables)
    finally:
        _BUDGET.reset(token)
