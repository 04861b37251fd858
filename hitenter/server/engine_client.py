"""The one interface every endpoint talks to: ``EngineClient`` (vLLM's idea), and the static facts of a
served model (``ModelInfo``).

An endpoint never sees the engine. It asks a client to
- ``add`` a request (token ids + SamplingParams) and read its outputs from the returned queue, or
  iterate ``generate``; ``abort`` it (its KV blocks are freed at the engine's next step);
- ``score`` prompts (every token's logprob given the ones before) or ``embed`` them: engine work,
  scheduled by the engine between its steps;
- read the ``tokenizer``, the ``info`` and the latest published ``snapshot`` (queue lengths, KV use).
The playground, which draws the engine's insides, has one more door: ``inspector`` (EngineInspector).

hitenter/server/local_engine.py implements it over an in-process AsyncLLMEngine; that file is the only
one in hitenter/server that knows the engine's attributes. A test may implement it with a script.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hitenter.engine.events import EngineEvent
from hitenter.engine.snapshot import EngineSnapshot
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.prompt_logprobs import PromptScores

Handle = tuple[str, "asyncio.Queue[RequestOutput | BaseException]"]   # request id, its outputs


@dataclass(frozen=True)
class ModelInfo:
    """What a served model is, fixed at load."""
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_length: int              # the model's trained window
    max_model_len: int               # the window this server gives a request
    block_size: int
    num_blocks: int
    kv_bytes_per_token: int
    max_num_batched_tokens: int
    parameter_count: int             # from the shapes (dense weights)
    path: str | None                 # the GGUF file, when there is one
    file_size: int = 0
    toy: bool = False                # the playground's trigram model (no transformer, no chat template)
    layer_types: tuple[str, ...] = ()   # a hybrid model's token mixer per layer (ModelConfig.layer_types)
    state_bytes_per_sequence: int = 0   # what its recurrent layers hold per sequence, whatever its length
    pooling: str = "mean"            # how an input becomes one vector (models/pooling.py); "rank": a reranker
    encoder: bool = False            # an embedding-only model (bidirectional, no text generation)
    embedding_size: int = 0          # the size of one pooled vector (a reranker: its scores)
    pooling_from_file: bool = False  # the file states its pooling (an embedding model: Matryoshka truncation)
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)   # GGUF key/values
    vision: bool = False             # a vision encoder (mmproj) is loaded: chat requests may hold images


class EngineInspector(Protocol):
    """The playground's window into a running engine (nothing else uses it). Methods marked *engine
    thread* may only be called from an event subscriber."""

    def subscribe(self, fn: Callable[[EngineEvent], None]) -> Callable[[], None]:
        """``fn(event)`` on the engine thread after every step; returns the unsubscribe function."""
        ...

    def trace(self, request_id: str, on: bool) -> None:
        """Keep (or stop keeping) the sampler trace and raw logits row of each step of a request."""
        ...

    def pop_trace(self, request_id: str) -> tuple[Any, Any]:
        """(sampler trace, raw logits row) of the request's latest sampled step, or Nones; consumed."""
        ...

    def kv_map(self, live: bool = False) -> dict[str, Any]:
        """The paged cache block by block: from the latest snapshot, or ``live`` (*engine thread*)."""
        ...

    def block_table(self, request_id: str) -> list[int]:
        """The request's KV blocks (*engine thread*)."""
        ...

    def step_counter(self) -> int: ...

    def model(self) -> Any:
        """The model's module, for traced forwards outside the engine (hitenter/models/trace.py)."""
        ...

    def toy_lookup(self, t2: int, t1: int) -> dict[str, Any] | None:
        """The trigram toy's counts for a context, or None for a real model."""
        ...

    def toy_end_id(self) -> int | None:
        """The trigram toy's start/end token (the context before the first token), or None."""
        ...

    def facts(self) -> dict[str, Any]:
        """Weight format and bytes, KV bytes per token, speculative decoding (the "fast" panel)."""
        ...

    def tp_counters(self) -> dict[str, Any] | None:
        """A tensor-parallel engine's process count and rank 0's collectives so far ({size, calls, seconds});
        None for one process."""
        ...

    def vision_encoder(self) -> Any:
        """The engine's vision encoder (hitenter/models/vision/loader.py VisionEncoder), None without one."""
        ...


class EngineClient(Protocol):
    info: ModelInfo

    @property
    def tokenizer(self) -> Any: ...

    @property
    def is_alive(self) -> bool: ...

    @property
    def inspector(self) -> EngineInspector: ...

    def vision_stats(self) -> tuple[int, int] | None:
        """(images encoded, images served from the encoder cache) so far; None without a vision encoder
        (a client without this method has none)."""
        ...

    def image_prompt(self, messages: list[dict[str, Any]], images: list[Any], add_generation_prompt: bool,
                     special_in_content: bool, **template_kw: Any) -> Any:
        """Blocking (call it off the loop): the engine's ImagePrompt of a conversation whose images are
        MEDIA_MARKER texts, with their RGB pixels in order (hitenter/engine/image_prompt.py); ValueError
        for a template that rejects it or markers that do not match the images. Only where info.vision."""
        ...

    async def add(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Handle:
        """Queue a request; raises ValueError / ContextOverflowError / QueueFullError before queueing."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request (never waits on a step); unknown ids are ignored."""
        ...

    def generate(self, prompt_ids: list[int], params: SamplingParams,
                 request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Outputs until the request finishes; leaving early aborts it."""
        ...

    async def score(self, prompts: list[list[int]], k: int) -> list[PromptScores]:
        """Each prompt token's raw logprob, rank and top ``k`` given the tokens before it."""
        ...

    async def embed(self, prompts: list[list[int]]) -> list[list[float]]:
        """Each prompt's vector by the model's pooling (``info.pooling``), L2-normalized."""
        ...

    async def pool(self, prompts: list[list[int]]) -> list[list[float]]:
        """Each prompt's pooled output as the model computes it, not normalized (a reranker: its scores)."""
        ...

    def snapshot(self) -> EngineSnapshot: ...

    def spec_stats(self) -> Any:
        """Speculative decoding counters (SpecDecodeStats) or None."""
        ...

    def set_max_queued(self, n: int | None) -> None: ...

    def shutdown(self) -> None: ...
