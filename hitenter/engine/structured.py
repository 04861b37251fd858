"""Structured outputs: a per-sequence grammar (xgrammar) applied as a token mask in the sampler chain.

- ``StructuredSpec`` (hitenter/sampling_params.py) is what a request asks for (``json`` = any JSON object, ``json_schema``, ``regex``,
  ``choice``, ``grammar`` (EBNF), ``tool_calls`` = calls in the model's own markup, built by the server's
  tool-call parser).
  It lives in ``SamplingParams.structured`` (immutable, hashable: the compiled grammar is cached by it).
- :class:`GrammarBackend` (one per tokenizer) compiles a spec once; a bad spec is a ``ValueError``
  naming the request field, raised before the request is queued.
- :class:`GrammarConstraint` is one sequence's matcher: ``fill`` writes its allowed-token bitmask,
  ``accept`` advances it after a token is emitted. The engine keeps it in ``Request.extra["grammar"]``.
- :class:`GrammarMask` is the chain stage (before temperature): it masks only the rows that carry a
  constraint, so unconstrained rows of the same batch are untouched and cost nothing.
- Speculative decoding: a constrained request's drafts are checked against its grammar. Prompt-lookup
  (point-mass) drafts are cut at the first token the grammar refuses; at verification each drafted
  position gets the grammar's mask after the drafts before it (:meth:`GrammarConstraint.speculate`),
  so a refused draft has target probability 0 and is rejected, and the matcher is rolled back by the
  number of rejected drafts (:meth:`GrammarConstraint.settle`).

Why xgrammar: its per-token mask (fill + apply) costs a small fraction of a decode step even on a 152k
vocabulary, where llguidance through our tokenizer adapter cost far more than a step on the same
vocabularies (figures: docs/design/sampling.md).
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from hitenter.sampling_params import StructuredSpec

_LOOSE_CHARS, _JSON_CHARS = r'[^\"\\\r\n]', r'[^\0-\x1f\"\\\r\n]'
COMPILE_SECONDS = 5.0          # a compilation's time limit (hitenter serve --max-grammar-compile-seconds)
CACHE_BYTES = 64 << 20         # the compiled-grammar cache's bound (--max-grammar-cache-bytes)
COMPILE_THREADS = 2            # compilations run on these threads, never the engine's
COMPILE_NICE = 10              # ... this much lower in CPU priority (Linux: per thread), so decoding goes first
_REFUSED_MAX = 1024            # specs whose compilation ran out of time, refused at once after


def configure(compile_seconds: float | None = None, cache_bytes: int | None = None) -> None:
    """Set the time limit of a compilation and the cache's byte bound (for backends built or used after)."""
    global COMPILE_SECONDS, CACHE_BYTES
    if compile_seconds is not None:
        COMPILE_SECONDS = float(compile_seconds)
    if cache_bytes is not None:
        CACHE_BYTES = int(cache_bytes)


class GrammarTimeoutError(ValueError):
    """A compilation ran past COMPILE_SECONDS (a ValueError naming the field: a 400)."""


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as e:     # pragma: no cover - a declared dependency
        raise ValueError("response_format: structured outputs need the xgrammar package") from e
    return xgrammar


def _lower_priority() -> None:
    """A compile thread yields the CPU to the engine and the event loop (raising niceness needs no rights):
    ``COMPILE_NICE`` above the process's own (a server started under ``nice`` keeps the difference)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + COMPILE_NICE))
    except (AttributeError, OSError):      # pragma: no cover - not Linux
        pass


class GrammarBackend:
    """xgrammar's compiler for one tokenizer / logits width.

    Compilation is bounded: it runs on one of ``COMPILE_THREADS`` threads (never the caller's, never the
    engine's; xgrammar releases the GIL while it compiles; nice ``COMPILE_NICE``) and the caller waits at most
    ``COMPILE_SECONDS``, then gets a ``GrammarTimeoutError``. A compilation cannot be interrupted inside
    xgrammar: one that ran out of time is abandoned (its thread finishes it, the result is cached if it
    fits) and its spec is refused at once from then on, so a client repeating it costs nothing; one that
    was still queued (behind others) is cancelled instead, and may be asked for again. Callers of
    the same spec share one compilation. Compiled grammars are cached, least recently used first out,
    up to ``CACHE_BYTES`` bytes (xgrammar's ``memory_size_bytes``)."""

    _pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar-compile", initializer=_lower_priority)

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        xgr = _xgr()
        n = min(tokenizer.vocab_size, vocab_size)
        vocab = [tokenizer.token_bytes(i) for i in range(n)]
        stops = sorted(t for t in tokenizer.eog_token_ids if t < n)
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.vocab_size = vocab_size
        self._lock = threading.Lock()
        self._cache: OrderedDict[StructuredSpec, tuple[Any, int]] = OrderedDict()
        self.cache_bytes = 0
        self._inflight: dict[StructuredSpec, Future[Any]] = {}
        self._waiters: dict[StructuredSpec, int] = {}       # callers waiting on an in-flight compilation
        self._refused: OrderedDict[int, float] = OrderedDict()   # hash(spec) -> the limit it ran past

    def compile(self, spec: StructuredSpec, timeout: float | None = None) -> Any:
        """The compiled grammar of ``spec``, waiting at most ``timeout`` (default COMPILE_SECONDS)."""
        limit = COMPILE_SECONDS if timeout is None else timeout
        fut = self.submit(spec)
        if not isinstance(fut, Future):
            return fut
        try:
            return fut.result(timeout=limit)
        except FutureTimeout:
            raise self.ran_out(spec, fut, limit) from None

    def submit(self, spec: StructuredSpec) -> Any:
        """The cached compiled grammar, or the Future of its compilation (shared by its callers); a spec
        that already ran out of time is a GrammarTimeoutError at once."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit[0]
            if hash(spec) in self._refused:
                raise self._timeout(spec, self._refused[hash(spec)], again=True)
            fut = self._inflight.get(spec)
            if fut is None:
                fut = self._inflight[spec] = self._pool.submit(self._compile, spec)
            self._waiters[spec] = self._waiters.get(spec, 0) + 1
        return fut

    def ran_out(self, spec: StructuredSpec, fut: Future[Any], limit: float) -> GrammarTimeoutError:
        """A caller's wait passed ``limit``: a compilation still queued is cancelled (if no one else waits),
        one that ran out of time itself makes its spec refused at once from now on."""
        with self._lock:
            if not self._leave(spec, fut):
                self._refused[hash(spec)] = limit
                while len(self._refused) > _REFUSED_MAX:
                    self._refused.popitem(last=False)
        return self._timeout(spec, limit)

    def abandon(self, spec: StructuredSpec, fut: Future[Any]) -> None:
        """A caller went away (its client disconnected): a queued compilation no one waits for is cancelled."""
        with self._lock:
            self._leave(spec, fut)

    def _leave(self, spec: StructuredSpec, fut: Future[Any]) -> bool:
        """One waiter fewer (under the lock); True when the compilation was still queued and is cancelled."""
        n = self._waiters.get(spec, 1) - 1
        if n > 0:
            self._waiters[spec] = n
            return not fut.running() and not fut.done()
        self._waiters.pop(spec, None)
        if fut.cancel():
            self._inflight.pop(spec, None)
            return True
        return False

    @staticmethod
    def _timeout(spec: StructuredSpec, limit: float, again: bool = False) -> GrammarTimeoutError:
        return GrammarTimeoutError(
            f"{spec.param}: grammar compilation {'already ran' if again else 'ran'} past the {limit:g} s limit "
            "(--max-grammar-compile-seconds); simplify the schema, pattern or choices")

    def _compile(self, spec: StructuredSpec) -> Any:
        try:
            compiled = self.compiler.compile_grammar(build_grammar(spec))
        except ValueError:
            raise
        except Exception as e:   # xgrammar raises RuntimeError/InvalidJSONError on bad schemas/regexes
            raise ValueError(f"{spec.param}: could not be compiled to a grammar: {e}") from e
        finally:
            with self._lock:
                self._inflight.pop(spec, None)
                self._waiters.pop(spec, None)
        size = int(compiled.memory_size_bytes)
        with self._lock:
            if size <= CACHE_BYTES and spec not in self._cache:
                self._cache[spec] = (compiled, size)
                self.cache_bytes += size
                while self.cache_bytes > CACHE_BYTES:
                    _, (_, old) = self._cache.popitem(last=False)
                    self.cache_bytes -= old
        return compiled

    def constraint(self, spec: StructuredSpec) -> GrammarConstraint:
        return GrammarConstraint(_xgr().GrammarMatcher(self.compile(spec)), self.vocab_size)


def _schema_grammar(schema: Any, param: str) -> Any:
    xgr = _xgr()
    if not isinstance(schema, dict):
        raise ValueError(f"{param}: the JSON schema must be an object")
    try:
        g = xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=True, any_whitespace=False)
    except Exception as e:
        raise ValueError(f"{param}: invalid JSON schema: {e}") from e
    text = str(g)
    if _LOOSE_CHARS in text:   # xgrammar 0.2.9: minLength/maxLength strings admit raw control characters
        g = xgr.Grammar.from_ebnf(text.replace(_LOOSE_CHARS, _JSON_CHARS))
    return g


def build_grammar(spec: StructuredSpec) -> Any:
    """The xgrammar Grammar of a spec; ValueError (naming ``spec.param``) when it is malformed."""
    xgr, p = _xgr(), spec.param
    try:
        if spec.kind == "json":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.kind == "json_schema":
            return _schema_grammar(json.loads(spec.value), p)
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.value)
        if spec.kind == "choice":
            choices = json.loads(spec.value)
            if not choices or not all(isinstance(c, str) for c in choices):
                raise ValueError(f"{p}: must be a non-empty list of strings")
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in choices))
        if spec.kind == "grammar":
            return xgr.Grammar.from_ebnf(spec.value)
        return _tool_call_grammar(json.loads(spec.value), p)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"{p}: invalid {spec.kind}: {e}") from e


_LEAD = "[ \\n]? [ \\n]?"      # the blank line a model writes after its thinking, before the first call


def _tool_call_grammar(value: dict[str, Any], param: str) -> Any:
    """Tool calls in a model's own markup: ``value["variants"]`` holds one call form per allowed function,
    either ``{"prefix", "schema", "suffix"}`` (literal text around JSON arguments following the schema)
    or ``{"ebnf"}`` (a whole call); one call, or with ``parallel`` several joined by ``value["sep"]``;
    up to two spaces or newlines before the first."""
    xgr = _xgr()
    forms = []
    for v in value["variants"]:
        if "ebnf" in v:
            forms.append(xgr.Grammar.from_ebnf(v["ebnf"]))
            continue
        forms.append(xgr.Grammar.concat(xgr.Grammar.from_ebnf(f"root ::= {json.dumps(v['prefix'])}"),
                                        _schema_grammar(v["schema"], param),
                                        *([xgr.Grammar.from_ebnf(f"root ::= {json.dumps(v['suffix'])}")]
                                          if v.get("suffix") else [])))
    call = forms[0] if len(forms) == 1 else xgr.Grammar.union(*forms)
    text = str(call).replace("root ::=", "call ::=", 1)
    rest = "" if not value.get("parallel") else f" ({json.dumps(value['sep'])} call)*" if value.get("sep") else " call*"
    return xgr.Grammar.from_ebnf(f"{text}\nroot ::= {_LEAD} call{rest}")


class GrammarConstraint:
    """One sequence's matcher (not thread-safe; used under the engine lock)."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._steps = 0   # drafted tokens the matcher accepted during this step's verification
        self._ahead = 0   # leading emitted tokens of this step the matcher already holds (accepted drafts)

    def fill(self, bitmask: Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> None:
        """Advance past an emitted token; a token the grammar refuses (a stop after the end) is ignored."""
        if not self.matcher.is_terminated():
            self.matcher.accept_token(token)

    def advance(self, tokens: Sequence[int]) -> None:
        """Advance past a step's emitted tokens (the accepted drafts the matcher already holds skipped)."""
        skip, self._ahead = self._ahead, 0
        for t in tokens[skip:]:
            self.accept(t)

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    # ---- speculative decoding -------------------------------------------------------------------------
    def push(self, token: int) -> bool:
        """Tentatively accept a drafted token (False, state unchanged: refused or terminated); undo with pop."""
        return not self.matcher.is_terminated() and bool(self.matcher.accept_token(token))

    def pop(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def legal_prefix(self, draft: Sequence[int]) -> int:
        """How many leading drafted tokens the grammar allows (all after it terminated); state unchanged."""
        steps, n = 0, len(draft)
        for j, t in enumerate(draft):
            if self.matcher.is_terminated():
                break                       # after the end nothing is constrained
            if not self.matcher.accept_token(t):
                n = j
                break
            steps += 1
        if steps:
            self.matcher.rollback(steps)
        return n

    def speculate(self, draft: Sequence[int]) -> list[DraftMask | None]:
        """The masks of a verification's ``len(draft) + 1`` positions: position j's is the grammar's after
        the drafts before it (None: no mask, as plain decoding after the grammar terminated, or a
        position after a refused draft, which the verifier rejects, so never reached). The matcher
        holds the drafts it accepted until :meth:`settle`."""
        bm = new_bitmask(len(draft) + 1, self.vocab_size)
        masks: list[DraftMask | None] = []
        self._steps = 0
        for j in range(len(draft) + 1):
            if self.matcher.is_terminated():
                return masks + [None] * (len(draft) + 1 - j)
            self.matcher.fill_next_token_bitmask(bm, j)
            masks.append(DraftMask(bm[j]))
            if j == len(draft) or not self.matcher.accept_token(draft[j]):
                return masks + [None] * (len(draft) - j)
            self._steps += 1
        return masks

    def settle(self, num_accepted: int) -> None:
        """After verification: roll back the drafts that were rejected, so the matcher holds exactly the
        accepted ones (the step's first ``num_accepted`` emitted tokens, skipped by :meth:`advance`)."""
        rejected = self._steps - min(self._steps, num_accepted)
        if rejected:
            self.matcher.rollback(rejected)
        self._steps, self._ahead = 0, num_accepted


class DraftMask:
    """One drafted position's precomputed bitmask row, in the shape GrammarMask reads a constraint."""

    terminated = False

    def __init__(self, bits: Tensor) -> None:
        self.bits = bits

    def fill(self, bitmask: Tensor, row: int) -> None:
        bitmask[row].copy_(self.bits)


@lru_cache(maxsize=8)
def _bitmask(rows: int, vocab: int) -> Tensor:
    return new_bitmask(rows, vocab)


def new_bitmask(rows: int, vocab: int) -> Tensor:
    """A normal tensor even when first asked for under inference mode (the draft model's), so it can be
    written in place outside it too."""
    with torch.inference_mode(False):
        return _xgr().allocate_token_bitmask(rows, vocab)


class GrammarMask:
    """Chain stage: rows with a constraint keep only the tokens their grammar allows (greedy rows too).
    A row whose grammar allows nothing the earlier stages left (e.g. min_tokens cut the only legal
    stop token) gets the grammar's mask over the raw logits' finite values instead of an all -inf row."""

    name = "grammar"

    def __call__(self, logits: Tensor, batch: Any) -> Tensor:
        cons = getattr(batch, "constraints", None)
        if not cons:
            return logits
        rows = [i for i, c in enumerate(cons) if c is not None and not c.terminated]
        if not rows:
            return logits
        n, v = logits.shape
        bm = _bitmask(n, v)
        for i in rows:
            cons[i].fill(bm, i)
        # xgrammar's CPU kernel on the constrained rows only (single-threaded, in place)
        _xgr().apply_token_bitmask_inplace(logits, bm, vocab_size=v, indices=rows)
        dead = [i for i, m in zip(rows, logits[rows].amax(dim=-1).tolist(), strict=True) if m == NEG_INF]
        for i in dead:   # earlier stages cut every legal token (min_tokens vs. a finished grammar)
            logits[i] = 0.0   # keep the grammar: its allowed tokens, uniformly
            _xgr().apply_token_bitmask_inplace(logits, bm, vocab_size=v, indices=[i])
        return logits


NEG_INF = float("-inf")


def constraints_of(requests: Any) -> list[Any]:
    """Per request its ``extra["grammar"]`` (or None): the sampler's ``constraints`` rows."""
    return [r.extra.get("grammar") for r in requests]


_BACKENDS: dict[int, tuple[Any, GrammarBackend]] = {}
_BACKENDS_LOCK = threading.Lock()


def backend_for(tokenizer: Any, vocab_size: int) -> GrammarBackend:
    """The (lazily built: slow for a large vocabulary) backend of a tokenizer and logits width."""
    key = id(tokenizer) ^ vocab_size
    with _BACKENDS_LOCK:
        hit = _BACKENDS.get(key)
        if hit is None or hit[0] is not tokenizer:
            hit = (tokenizer, GrammarBackend(tokenizer, vocab_size))
            _BACKENDS[key] = hit
        return hit[1]
