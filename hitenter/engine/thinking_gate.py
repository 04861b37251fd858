"""The thinking gate: one sequence's thinking section, found in its tokens, bounded and closed.

``ThinkingGate(spec, prompt_ids, inner)`` follows a reply token by token (``SamplingParams.thinking``,
a ``ThinkingSpec`` of token ids) and is the sequence's constraint in ``Request.extra["grammar"]``: it
has the interface of ``structured.GrammarConstraint`` (``fill`` / ``accept`` / ``advance`` and the
speculative ``push`` / ``pop`` / ``legal_prefix`` / ``speculate`` / ``settle``), so the sampler's
grammar stage and speculative decoding apply it as they apply a grammar.

Tags are found by their bytes (``Tags``, with the vocabulary's token bytes; by their ids without
them), so a tag the model spells with other tokens than the ones it was encoded to counts too.

Phases of a reply:
- ``PRE``: the section has not started (the prompt did not open it: its last ``start`` is not after
  its last ``end``). Tokens ending in ``start`` open it. With an ``inner`` grammar (a forced tool
  call) the reply may open the section with ``start[0]`` (its remaining ids are then forced) or begin
  the grammar at once: the mask is the grammar's plus ``start[0]``.
- ``THINK``: inside. Every token counts; tokens ending in ``end`` close it (``DONE``). When ``budget``
  tokens were written inside, the next tokens are ``force`` (``FORCE``, one id per step), then the
  section is closed. Budget 0 forces ``force`` at once.
- ``DONE``: closed; the ``inner`` grammar (if any) constrains the rest, else nothing does. A later
  ``start`` does not reopen it (the reasoning parsers read one section per reply).

Deterministic and per row: the mask depends only on the sequence's own tokens, so a row's tokens do
not depend on its batch. A token outside the mask (which the sampler never picks) leaves the state
unchanged, as a grammar ignores a refused token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from hitenter.engine.structured import DraftMask, backend_for, new_bitmask
from hitenter.sampling_params import SamplingParams, ThinkingSpec

PRE, STARTING, THINK, FORCE, DONE = "pre", "starting", "think", "force", "done"


@dataclass(frozen=True)
class GateState:
    phase: str
    count: int = 0                  # tokens written inside the section
    k: int = 0                      # next index into start (STARTING) or force (FORCE)
    tail: tuple[int, ...] = ()      # the last tokens, for finding a tag that spans several


TokenBytes = Callable[[int], bytes]
PROMPT_TAIL = 64            # prompt tokens searched for an opening start tag (the template writes it last)


class Tags:
    """Finds the start and end tags at the end of a token sequence: by their bytes when the vocabulary's
    are given (a tag the model spells with other tokens than the ones it was encoded to is found too),
    else by their ids."""

    def __init__(self, spec: ThinkingSpec, token_bytes: TokenBytes | None = None) -> None:
        self.spec, self.tb = spec, token_bytes
        self.start_b = self._bytes(spec.start)
        self.end_b = self._bytes(spec.end)
        self.keep = max(len(spec.start), len(spec.end), len(self.start_b), len(self.end_b))

    def _bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.tb(t) for t in ids) if self.tb is not None else b""

    def ends_with_start(self, tail: Sequence[int]) -> bool:
        return self._ends_with(tail, self.spec.start, self.start_b)

    def ends_with_end(self, tail: Sequence[int]) -> bool:
        return self._ends_with(tail, self.spec.end, self.end_b)

    def _ends_with(self, tail: Sequence[int], ids: tuple[int, ...], text: bytes) -> bool:
        if self.tb is None:
            return tuple(tail[-len(ids):]) == ids
        return self._bytes(tail).endswith(text)

    def opened_by(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt leaves the section open: its last start tag after its last end tag."""
        tail = list(prompt_ids[-PROMPT_TAIL:])
        if self.tb is None:
            return _last(tail, self.spec.start) > _last(tail, self.spec.end)
        text = self._bytes(tail)
        return text.rfind(self.start_b) > text.rfind(self.end_b)


def _last(seq: Sequence[int], tag: Sequence[int]) -> int:
    """Index of the last occurrence of ``tag`` in ``seq`` (-1: none)."""
    n = len(tag)
    for i in range(len(seq) - n, -1, -1):
        if list(seq[i:i + n]) == list(tag):
            return i
    return -1


def prompt_opens(spec: ThinkingSpec, prompt_ids: Sequence[int], token_bytes: TokenBytes | None = None) -> bool:
    """Whether the prompt leaves the section open: its last start tag after its last end tag."""
    return Tags(spec, token_bytes).opened_by(prompt_ids)


def _set_bit(bitmask: Tensor, row: int, token: int) -> None:
    word, bit = divmod(token, 32)
    value = bitmask[row, word].item() | (1 << bit)
    bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value     # int32 words


class ThinkingGate:
    """One sequence's gate (see the module docstring); not thread-safe (used under the engine lock)."""

    def __init__(self, spec: ThinkingSpec, prompt_ids: Sequence[int], vocab_size: int, inner: Any = None,
                 token_bytes: TokenBytes | None = None) -> None:
        """``inner``: the sequence's grammar (a ``GrammarConstraint``), applied once the section closed;
        ``token_bytes``: the vocabulary's bytes, to find the tags however the model spells them."""
        self.spec, self.inner, self.vocab_size = spec, inner, vocab_size
        self.tags = Tags(spec, token_bytes)
        self._keep = self.tags.keep
        self.state = self._entered() if self.tags.opened_by(prompt_ids) else GateState(PRE)
        self._hist: list[tuple[GateState, bool]] = []    # per pushed token: the state before, inner pushed
        self._steps = 0
        self._ahead = 0

    # ---- the state machine --------------------------------------------------------------------------
    def _entered(self) -> GateState:
        """The section just opened (budget 0: closing starts at once)."""
        if self.spec.budget == 0:
            return GateState(FORCE)
        return GateState(THINK)

    def forced(self) -> int | None:
        """The one token the next position must be (None: no single token)."""
        s = self.state
        if s.phase == FORCE:
            return self.spec.force[s.k]
        if s.phase == STARTING:
            return self.spec.start[s.k]
        return None

    def _inner_live(self) -> bool:
        return self.inner is not None and not self.inner.terminated

    def _to_inner(self, token: int) -> bool:
        """Whether ``token`` goes to the inner grammar."""
        s = self.state
        if not self._inner_live():
            return False
        return s.phase == DONE or (s.phase == PRE and token != self.spec.start[0])

    def _next(self, token: int) -> GateState | None:
        """The state after ``token`` (None: the token is outside the gate's mask)."""
        s, spec = self.state, self.spec
        want = self.forced()
        if want is not None and token != want:
            return None
        tail = (s.tail + (token,))[-self._keep:]
        if s.phase == FORCE:
            return GateState(DONE) if s.k + 1 == len(spec.force) else replace(s, k=s.k + 1)
        if s.phase == STARTING:
            return self._entered() if s.k + 1 == len(spec.start) else replace(s, k=s.k + 1, tail=tail)
        if s.phase == THINK:
            if self.tags.ends_with_end(tail):
                return GateState(DONE)
            count = s.count + 1
            if spec.budget is not None and count >= spec.budget:
                return GateState(FORCE, count)
            return replace(s, count=count, tail=tail)
        if s.phase == PRE:
            if self._inner_live():
                if token != spec.start[0]:
                    return GateState(DONE)          # the reply skipped thinking: the grammar has begun
                return self._entered() if len(spec.start) == 1 else GateState(STARTING, k=1)
            if self.tags.ends_with_start(tail):
                return self._entered()
            return replace(s, tail=tail)
        return s

    # ---- the grammar interface ---------------------------------------------------------------------
    @property
    def terminated(self) -> bool:
        """True when nothing is masked at the next position (the grammar stage skips the row)."""
        s = self.state
        if s.phase in (FORCE, STARTING):
            return False
        if s.phase in (PRE, DONE):
            return not self._inner_live()
        return True

    def fill(self, bitmask: Tensor, row: int) -> None:
        want = self.forced()
        if want is not None:
            bitmask[row].zero_()
            _set_bit(bitmask, row, want)
            return
        self.inner.fill(bitmask, row)
        if self.state.phase == PRE:
            _set_bit(bitmask, row, self.spec.start[0])

    def push(self, token: int) -> bool:
        """Take a token, remembering how to undo it (False, state unchanged: outside the mask)."""
        nxt = self._next(token)
        if nxt is None:
            return False
        into = self._to_inner(token)
        if into and not self.inner.push(token):
            return False
        self._hist.append((self.state, into))
        self.state = nxt
        return True

    def pop(self, num_tokens: int) -> None:
        inner = 0
        for _ in range(num_tokens):
            self.state, into = self._hist.pop()
            inner += into
        if inner:
            self.inner.pop(inner)

    def accept(self, token: int) -> None:
        """Advance past an emitted token (a token outside the mask is ignored)."""
        nxt = self._next(token)
        if nxt is None:
            return
        if self._to_inner(token):
            self.inner.accept(token)
        self.state = nxt
        self._hist.clear()

    def advance(self, tokens: Sequence[int]) -> None:
        skip, self._ahead = self._ahead, 0
        self._hist.clear()
        for t in tokens[skip:]:
            self.accept(t)

    def legal_prefix(self, draft: Sequence[int]) -> int:
        n = len(draft)
        pushed = 0
        for j, t in enumerate(draft):
            if not self.push(t):
                n = j
                break
            pushed += 1
        self.pop(pushed)
        return n

    def speculate(self, draft: Sequence[int]) -> list[Any]:
        """The masks of ``len(draft) + 1`` verification positions (None: unmasked, or after a refused
        draft); the accepted drafts stay pushed until :meth:`settle`."""
        bm = new_bitmask(len(draft) + 1, self.vocab_size)
        masks: list[Any] = []
        self._steps = 0
        for j in range(len(draft) + 1):
            if self.terminated:
                masks.append(None)
            else:
                self.fill(bm, j)
                masks.append(DraftMask(bm[j]))
            if j == len(draft) or not self.push(draft[j]):
                return masks + [None] * (len(draft) - j)
            self._steps += 1
        return masks

    def settle(self, num_accepted: int) -> None:
        rejected = self._steps - min(self._steps, num_accepted)
        self.pop(rejected)
        self._steps, self._ahead = 0, num_accepted



def allowed_tokens(gate: ThinkingGate) -> Tensor:
    """The gate's mask at the next position as booleans ``[vocab_size]`` (tests, tracing)."""
    if gate.terminated:
        return torch.ones(gate.vocab_size, dtype=torch.bool)
    bm = new_bitmask(1, gate.vocab_size)
    gate.fill(bm, 0)
    words = bm[0].to(torch.int64) & 0xFFFFFFFF
    bits = (words[:, None] >> torch.arange(32)) & 1
    return bits.flatten()[:gate.vocab_size].bool()


def constraint_for(params: SamplingParams, prompt_ids: Sequence[int], tokenizer: Any, vocab_size: int) -> Any:
    """One sequence's constraint (``Request.extra["grammar"]``): its grammar, its thinking gate (with
    the grammar inside), or None. A bad grammar is a ValueError naming the request field."""
    grammar = backend_for(tokenizer, vocab_size).constraint(params.structured) if params.structured else None
    if params.thinking is None:
        return grammar
    return ThinkingGate(params.thinking, prompt_ids, vocab_size, grammar, tokenizer.token_bytes)
