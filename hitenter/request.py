"""A request as the scheduler and KV cache manager see it.

The one scheduling rule: each step, a running request is given up to
``num_tokens - num_computed_tokens`` new tokens. A fresh prompt is far behind, a decode
is one behind, a prefix-cache hit advances ``num_computed_tokens`` before the first step.
Speculative decoding appends drafted tokens (``spec_token_ids``, never verified output) after the
outputs: they count in ``num_tokens``/``all_token_ids``, so one step scores them all; the scheduler
rolls ``num_computed_tokens`` back over the rejected ones.
Images (``Request.images``, ImageRun): each image's soft tokens are a run of placeholder ids in the prompt
whose rows take the vision encoder's output instead of token embeddings; a run is computed within one step
(the scheduler never cuts it, the KV cache never serves half of it) and the prefix cache's block hashes of
the blocks it touches carry its content key.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hitenter.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"   # disaggregated or side prefill: not schedulable until its KV is ready
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")


@dataclass
class RequestMetrics:
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    num_preemptions: int = 0

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(frozen=True, eq=False)
class ImageRun:
    """One image in a prompt: its soft-token rows ``[start, start + length)``, the content key the prefix
    cache and the encoder cache know it by (a digest of the image's pixels as the encoder takes them), the
    encoder's input (``pixels``), and whether its rows attend to each other bidirectionally (Gemma 3)."""

    start: int
    length: int
    key: bytes
    pixels: Any
    bidirectional: bool = False

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int                       # resolved budget (never None here)
    eos_token_ids: frozenset[int] = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)   # drafted, unverified (speculative decoding)
    num_computed_tokens: int = 0          # tokens whose K/V are in the cache
    num_cached_tokens: int = 0            # prompt tokens served by a prefix-cache hit
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    extra: dict[str, Any] = field(default_factory=dict)   # per-request state of other parts (spec stats, ...)
    generator: Any = None                 # torch.Generator of a seeded / random request; None when greedy
    images: tuple[ImageRun, ...] = ()     # the prompt's images, in order, not overlapping

    def image_keys(self, start: int, end: int) -> list[bytes]:
        """The content keys of the images with rows in ``[start, end)`` (a prefix-cache block's extra key)."""
        return [im.key for im in self.images if im.start < end and im.end > start]

    def image_floor(self, pos: int) -> int:
        """``pos`` moved back to the start of an image whose rows it would cut (start < pos < end)."""
        for im in self.images:
            if im.start < pos < im.end:
                return im.start
        return pos

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + verified output + drafted tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """A new list (prompt + outputs + drafts): for tests and tools; the step uses ``token_slice``."""
        return self.prompt_token_ids + self.output_token_ids + self.spec_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without concatenating the three lists (cost: end - start)."""
        out: list[int] = []
        for part in (self.prompt_token_ids, self.output_token_ids, self.spec_token_ids):
            n = len(part)
            if start < n and end > 0:
                out.extend(part[max(start, 0):min(end, n)])
            start, end = start - n, end - n
            if end <= 0:
                break
        return out

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
        }.get(self.status)
