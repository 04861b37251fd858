"""Per-step engine events, published to subscribers (the playground, metrics, tests).

Each ``EngineEvent`` says what one ``LLMEngine.step()`` really did: which requests prefilled
how many tokens (and from which position), which decoded, the KV block events of the step,
who finished or was preempted, and the step's own timestamps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ScheduledWork:
    request_id: str
    start: int          # first position computed this step
    num_tokens: int     # tokens computed this step
    kind: str           # "prefill" (catching up on a prompt, maybe a chunk) or "decode"
    sampled: int | None = None   # first token id this step produced, if the request caught up
    tokens: list[int] = field(default_factory=list)   # every token it produced (several when speculating)


@dataclass
class EngineEvent:
    step_id: int
    t_start: float
    t_end: float
    t_model: float                                   # seconds in the model forward
    work: list[ScheduledWork] = field(default_factory=list)
    kv_events: list[Any] = field(default_factory=list)
    finished: list[tuple[str, str]] = field(default_factory=list)   # (request_id, finish_reason)
    preempted: list[str] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_free_blocks: int = 0


Subscriber = Callable[[EngineEvent], None]


class EventBus:
    """Thread-safe fan-out of EngineEvents. Subscribers must be quick (they run in the engine loop)."""

    def __init__(self) -> None:
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subs:
                    self._subs.remove(fn)

        return unsubscribe

    @property
    def active(self) -> bool:
        return bool(self._subs)

    def publish(self, event: EngineEvent) -> None:
        with self._lock:
            subs = list(self._subs)
        for fn in subs:
            fn(event)


def step_event(sched: Any, t_model: float, new_tokens: dict[str, list[int]], finished: list[tuple[str, str]],
               kv_events: list[object], t0: float, scheduler: Any, kv: Any) -> EngineEvent:
    """The EngineEvent of a step that ran ``sched`` (a SchedulerOutput), built after its update."""
    work = []
    for sr in sched.scheduled:
        r = sr.request
        kind = "decode" if sr.num_computed_tokens >= r.num_prompt_tokens else "prefill"
        tok = new_tokens.get(r.request_id)
        work.append(ScheduledWork(r.request_id, sr.num_computed_tokens, sr.num_new_tokens, kind,
                                  tok[0] if tok else None, list(tok or ())))
    return EngineEvent(
        step_id=sched.step_id, t_start=t0, t_end=time.perf_counter(), t_model=t_model, work=work,
        kv_events=kv_events, finished=finished, preempted=[r.request_id for r in sched.preempted],
        num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
        kv_usage=kv.usage, num_free_blocks=kv.num_free_blocks,
    )
