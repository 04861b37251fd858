"""A request on its way in: validated and tokenized in the caller's thread, admitted by the engine's.

``prepare`` does every check that needs no engine state (prompt ids, sampling params against the
vocabulary, the context window), so bad input raises in the caller before anything is queued; the
engine thread then ``admit``s the ``PendingRequest`` (scheduler queue, KV-size check, disaggregated
prefill), directly (``LLMEngine.add_request``) or from its inbox (``LLMEngine.submit``).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

from hitenter.engine.output_processor import GroupState
from hitenter.engine.sampler import make_generator
from hitenter.errors import ContextOverflowError
from hitenter.request import Request
from hitenter.sampling_params import SamplingParams


@dataclass
class PendingRequest:
    group: GroupState

    @property
    def request_id(self) -> str:
        return self.group.request_id


def encode_prompt(tokenizer: Any, vocab_size: int, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    ids = list(prompt)
    bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt: token ids must be integers in 0..{vocab_size - 1}, got {bad[:5]}")
    return ids


def resolve_max_tokens(n_ctx: int, n_prompt: int, params: SamplingParams) -> int:
    """max_tokens with the context window applied; raises ContextOverflowError, never truncates."""
    if params.max_tokens is None:
        if n_prompt >= n_ctx:
            raise ContextOverflowError(n_prompt, n_ctx)
        return n_ctx - n_prompt
    if n_prompt + params.max_tokens > n_ctx:
        raise ContextOverflowError(n_prompt, n_ctx, params.max_tokens)
    return params.max_tokens


def make_requests(request_id: str, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                  eog: frozenset[int], arrival_time: float | None) -> list[Request]:
    """The n sequences of a request (ids ``rid``, or ``rid#j`` when n > 1), each with its generator."""
    reqs = []
    for j in range(params.n):
        rid = request_id if params.n == 1 else f"{request_id}#{j}"
        req = Request(rid, list(prompt_ids), params, max_tokens, eos_token_ids=eog)
        if arrival_time is not None:
            req.metrics.arrival_time = arrival_time
        if not params.is_greedy:
            req.generator = make_generator(None if params.seed is None else params.seed + j)
        reqs.append(req)
    return reqs


class Inbox:
    """Arrivals and aborts from other threads, drained by the engine thread at the top of every step."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.wake = threading.Event()       # set on every put: an idle engine loop wakes at once
        self.num_adds = 0                   # arrivals queued, not yet drained (for queue-full checks)

    def put_add(self, pending: PendingRequest) -> None:
        self.num_adds += 1
        self._q.put(("add", pending))
        self.wake.set()

    def put_abort(self, request_id: str) -> None:
        self._q.put(("abort", request_id))
        self.wake.set()

    def __bool__(self) -> bool:
        return not self._q.empty()

    def drain(self) -> list[tuple[str, Any]]:
        items = []
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                return items
            if items[-1][0] == "add":
                self.num_adds -= 1
