"""SamplingParams: how one request wants its tokens chosen and when it wants to stop.

Contract:
- Validated on construction: every failure is a ``ValueError`` whose message starts with the field
  name and states the allowed range (``"temperature: must be in [0, 2], got 3.0"``). An unknown
  keyword is a ``TypeError`` (plain dataclass behaviour).
- Immutable: the dataclass is frozen; ``stop``/``stop_token_ids`` are normalized to fresh lists and
  ``logit_bias`` to a fresh ``dict[int, float]`` (string keys from JSON converted to int). Treat them as
  read-only; use :meth:`SamplingParams.replace` for a modified copy.
- Token ids in ``logit_bias``/``stop_token_ids`` can only be range-checked once the vocabulary is known:
  the engine calls :meth:`validate_for_vocab` before queueing the request.

Semantics follow vLLM/OpenAI: ``repetition_penalty`` (vLLM) divides positive / multiplies negative
logits of every token seen in the prompt or the output; ``presence_penalty`` and ``frequency_penalty``
(OpenAI) subtract ``presence * [count > 0] + frequency * count`` over output tokens only;
``logprobs=k`` returns the chosen token's logprob plus the top ``k`` alternatives.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Temperatures below this are treated as greedy (as vLLM does) so that 1/T never blows up.
GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1   # what torch.Generator.manual_seed accepts


STRUCTURED_KINDS = ("json", "json_schema", "regex", "choice", "grammar", "tool_calls")


@dataclass(frozen=True)
class StructuredSpec:
    """A structured-output constraint (compiled by hitenter/engine/structured.py): ``json`` (any JSON
    object), ``json_schema``, ``regex``, ``choice``, ``grammar`` (EBNF) or ``tool_calls``. Immutable and
    hashable: the compiled grammar is cached by it."""

    kind: str           # one of STRUCTURED_KINDS
    value: str = ""     # schema JSON / regex / EBNF / JSON list of choices; for tool_calls: JSON {schema, parallel}
    param: str = "response_format"   # the request field it came from (named in errors)

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(f"{self.param}: unknown structured output kind {self.kind!r}")


@dataclass(frozen=True)
class ThinkingSpec:
    """A reply's thinking section, in token ids, for the engine to find it and to close it
    (hitenter/engine/thinking_gate.py). ``start`` / ``end``: the ids of the tags that open and close it
    (the section counts as opened by the prompt when the prompt's last ``start`` comes after its last
    ``end``); ``force``: the ids written to close it when the budget is spent (``end`` when empty);
    ``budget``: how many tokens the section may take before ``force`` is written (None: no bound, the
    section only holds back a structured constraint until it closes). Immutable and hashable."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    force: tuple[int, ...] = ()
    budget: int | None = None
    param: str = "thinking"          # the request field the budget came from (named in errors)

    def __post_init__(self) -> None:
        for name in ("start", "end", "force"):
            ids = getattr(self, name)
            if not isinstance(ids, tuple) or not all(_is_int(i) and i >= 0 for i in ids):
                _fail(self.param, f"{name}: must be a tuple of token ids (integers >= 0), got {ids!r}")
        if not self.start or not self.end:
            _fail(self.param, "the thinking section needs a start and an end tag")
        if not self.force:
            object.__setattr__(self, "force", self.end)
        if self.budget is not None and (not _is_int(self.budget) or self.budget < 0):
            _fail(self.param, f"the thinking budget must be an integer >= 0 or null, got {self.budget!r}")

    @property
    def ids(self) -> tuple[int, ...]:
        return self.start + self.end + self.force


def _fail(name: str, msg: str) -> None:
    raise ValueError(f"{name}: {msg}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _check_int(name: str, x: object, lo: int | None, hi: int | None, rng: str) -> None:
    if not _is_int(x) or (lo is not None and x < lo) or (hi is not None and x > hi):  # type: ignore[operator]
        _fail(name, f"must be an integer {rng}, got {x!r}")


def _check_real(name: str, x: object, ok: bool, rng: str) -> None:
    if not _is_real(x) or not ok:
        _fail(name, f"must be a number {rng}, got {x!r}")


def _check_bool(name: str, x: object) -> None:
    if not isinstance(x, bool):
        _fail(name, f"must be true or false, got {x!r}")


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | Mapping[str, float] | None = None
    seed: int | None = None
    logprobs: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: StructuredSpec | None = None     # structured output (StructuredSpec above)
    thinking: ThinkingSpec | None = None         # the thinking section and its budget (ThinkingSpec above)
    speculate: bool = True   # False: never drafted for on an engine set up for speculative decoding (one token a step)

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1, None, ">= 1")
        t = self.temperature
        _check_real("temperature", t, _is_real(t) and 0 <= t <= 2, "in [0, 2] (0 = greedy)")
        p = self.top_p
        _check_real("top_p", p, _is_real(p) and 0 < p <= 1, "in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1:
            _fail("top_k", f"must be an integer, -1 or 0 (off) or >= 1, got {self.top_k!r}")
        m = self.min_p
        _check_real("min_p", m, _is_real(m) and 0 <= m <= 1, "in [0, 1]")
        r = self.repetition_penalty
        _check_real("repetition_penalty", r, _is_real(r) and r > 0, "> 0 (1 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check_real(name, v, _is_real(v) and -2 <= v <= 2, "in [-2, 2]")
        object.__setattr__(self, "logit_bias", self._normalize_logit_bias(self.logit_bias))
        if self.seed is not None:
            _check_int("seed", self.seed, _SEED_MIN, _SEED_MAX, f"in [{_SEED_MIN}, {_SEED_MAX}] or null")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS, f"in [0, {MAX_LOGPROBS}] or null")
        object.__setattr__(self, "stop", self._normalize_stop(self.stop))
        ids = self.stop_token_ids
        if ids is None:
            ids = []
        if isinstance(ids, str | bytes) or not all(_is_int(i) and i >= 0 for i in ids):
            _fail("stop_token_ids", f"must be a list of token ids (integers >= 0), got {ids!r}")
        object.__setattr__(self, "stop_token_ids", list(ids))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "speculate"):
            _check_bool(name, getattr(self, name))
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1, None, ">= 1 or null (= the rest of the context)")
        _check_int("min_tokens", self.min_tokens, 0, None, ">= 0")
        if self.structured is not None and not isinstance(self.structured, StructuredSpec):
            _fail("structured", f"must be a StructuredSpec or None, got {self.structured!r}")
        if self.thinking is not None and not isinstance(self.thinking, ThinkingSpec):
            _fail("thinking", f"must be a ThinkingSpec or None, got {self.thinking!r}")

    @staticmethod
    def _normalize_logit_bias(lb: object) -> dict[int, float]:
        if lb is None:
            return {}
        if not isinstance(lb, Mapping):
            _fail("logit_bias", f"must be a map of token id -> bias in [-100, 100], got {lb!r}")
        out: dict[int, float] = {}
        for k, v in lb.items():  # type: ignore[union-attr]
            key: int | None = None
            if _is_int(k):
                key = k  # type: ignore[assignment]
            elif isinstance(k, str) and k.strip().lstrip("+").isdigit():
                key = int(k)
            if key is None or key < 0:
                _fail("logit_bias", f"keys must be token ids (integers >= 0), got {k!r}")
            if not _is_real(v) or not -100 <= v <= 100:
                _fail("logit_bias", f"values must be numbers in [-100, 100], got {v!r} for token {k!r}")
            out[key] = float(v)  # type: ignore[index]
        return out

    @staticmethod
    def _normalize_stop(stop: object) -> list[str]:
        if stop is None:
            return []
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, list | tuple) or not all(isinstance(s, str) for s in items):
            _fail("stop", f"must be a string or a list of strings, got {stop!r}")
        if any(s == "" for s in items):  # type: ignore[union-attr]
            _fail("stop", "must not contain empty strings")
        return list(items)  # type: ignore[arg-type]

    # ---- derived ----
    @property
    def is_greedy(self) -> bool:
        """True when the request takes the argmax (temperature 0, or below 1e-5 like vLLM)."""
        return self.temperature < GREEDY_EPS

    @property
    def max_stop_len(self) -> int:
        """Length in characters of the longest stop string (0 when there is none)."""
        return max((len(s) for s in self.stop), default=0)  # type: ignore[union-attr]

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Raise ValueError (naming the field) when a logit_bias / stop_token_ids id is >= vocab_size."""
        for tid in self.logit_bias:  # type: ignore[union-attr]
            if tid >= vocab_size:
                _fail("logit_bias", f"token id {tid} is out of range: the vocabulary has ids 0..{vocab_size - 1}")
        for tid in self.stop_token_ids:  # type: ignore[union-attr]
            if tid >= vocab_size:
                _fail("stop_token_ids",
                      f"token id {tid} is out of range: the vocabulary has ids 0..{vocab_size - 1}")
        for tid in self.thinking.ids if self.thinking is not None else ():
            if tid >= vocab_size:
                _fail(self.thinking.param, f"token id {tid} is out of range: the vocabulary has ids 0..{vocab_size - 1}")

    def replace(self, **changes: Any) -> SamplingParams:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)
