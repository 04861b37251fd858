"""``LocalEngineClient``: the EngineClient (hitenter/server/engine_client.py) over an in-process
AsyncLLMEngine, and the playground's ``LocalInspector``. The only module of hitenter/server that knows
the engine's attributes; everything else goes through the protocol.

- ``add`` runs ``AsyncLLMEngine.add_request`` (validation, tokenizing, grammar compilation) in a worker
  thread, so the event loop never waits on it; a caller cancelled mid-add aborts what got added.
- ``score`` / ``embed`` / ``pool`` are jobs on the engine's own thread between its steps (engine_jobs.py,
  pooling_jobs.py), one forward of at most ``min(max_num_batched_tokens, SLICE_TOKENS)`` tokens per step;
  ``embed`` / ``pool`` keep to the process's pooling share while any engine generates, in slices it may
  make smaller (hitenter/engine/cpu_share.py).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hitenter.engine import structured
from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.engine.events import EngineEvent
from hitenter.engine.image_prompt import chat_segments
from hitenter.engine.snapshot import EngineSnapshot, SnapshotView
from hitenter.engine.structured import backend_for
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.engine_client import Handle, ModelInfo
from hitenter.server.engine_jobs import EngineJobs
from hitenter.server.pooling_jobs import pool_job
from hitenter.server.prompt_logprobs import SLICE_TOKENS, PromptScores, score_job


def _parameter_count(c: Any) -> int:
    """Dense weights from the shapes: embeddings (+ an untied head), attention, FFN (or experts), norms."""
    h, hd = c.hidden_size, c.head_dim
    attn = h * c.num_heads * hd * 2 + h * c.num_kv_heads * hd * 2
    ffn = 3 * h * (c.expert_intermediate_size * c.num_experts if c.num_experts else c.intermediate_size)
    embed = c.vocab_size * h * (1 if c.tie_word_embeddings else 2)
    return int(embed + c.num_layers * (attn + ffn + 2 * h) + h)


def model_info(llm: Any) -> ModelInfo:
    """The static facts of an LLMEngine."""
    from hitenter.models.attention import kv_tensors
    from hitenter.models.kv_dtype import value_bytes

    c, parts = llm.model_config, llm.parts
    caches = kv_tensors(getattr(llm.runner, "kv_caches", None) or [])
    path = parts.model_path if parts.model_path and os.path.isfile(parts.model_path) else None
    return ModelInfo(
        architecture=c.architecture, vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_layers=c.num_layers,
        num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, context_length=c.context_length,
        max_model_len=int(llm.max_model_len), block_size=int(llm.kv_manager.block_size),
        num_blocks=int(parts.num_blocks),
        kv_bytes_per_token=c.kv_bytes_per_token(value_bytes(caches[0].dtype)) if caches else 0,
        max_num_batched_tokens=int(parts.scheduler_config.max_num_batched_tokens),
        parameter_count=_parameter_count(c), path=path, file_size=Path(path).stat().st_size if path else 0,
        toy=hasattr(parts.model, "lookup"), metadata=dict(parts.header) if path else {}, layer_types=tuple(c.layer_types),
        state_bytes_per_sequence=int(getattr(parts.model, "state_bytes_per_slot", lambda: 0)()),
        vision=llm.vision is not None,
        **_pooling_info(c, parts.model))


def _pooling_info(c: Any, model: Any) -> dict[str, Any]:
    """ModelInfo's pooling fields: the model's pooling, whether it only embeds, its pooled vector's size."""
    from hitenter.models.pooling import effective_pooling

    pooler = getattr(model, "pooler", None)
    return {"pooling": effective_pooling(c), "encoder": not c.causal, "pooling_from_file": bool(c.pooling),
            "embedding_size": int(pooler.out_features) if pooler is not None else c.hidden_size}


class LocalEngineClient:
    """EngineClient over ``engine`` (an AsyncLLMEngine; ``engine.engine`` is its LLMEngine)."""

    def __init__(self, engine: AsyncLLMEngine) -> None:
        self.engine = engine
        self._llm = engine.engine
        self.info = model_info(self._llm)
        self._share = getattr(self._llm, "cpu_share", None)      # the process's arbiter (engine/cpu_share.py)
        self._jobs = EngineJobs(self._llm, self._share)
        self._slice = max(1, min(self.info.max_num_batched_tokens, SLICE_TOKENS))
        self._inspector = LocalInspector(engine)

    @property
    def tokenizer(self) -> Any:
        return self._llm.tokenizer

    @property
    def is_alive(self) -> bool:
        return self.engine.is_alive

    @property
    def inspector(self) -> LocalInspector:
        return self._inspector

    def vision_stats(self) -> tuple[int, int] | None:
        cache = self._llm.vision
        return None if cache is None else (cache.runs, cache.hits)

    def image_prompt(self, messages: list[dict[str, Any]], images: list[Any], add_generation_prompt: bool,
                     special_in_content: bool, **template_kw: Any) -> Any:
        segments = chat_segments(self._llm.tokenizer, messages, add_generation_prompt, special_in_content,
                                 **template_kw)
        return self._llm.image_prompt(segments, images, add_bos=False)

    async def add(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Handle:
        if params.structured is not None:
            await self._compiled(params.structured)
        loop = asyncio.get_running_loop()
        fut = asyncio.ensure_future(asyncio.to_thread(self.engine.add_request, prompt_ids, params, request_id,
                                                      loop=loop))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:      # the caller went away mid-add: abort what got added
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else self.abort(f.result()[0]))
            raise

    async def _compiled(self, spec: Any) -> None:
        """Compile a request's grammar before it is queued, off the engine thread and this loop, waiting at
        most --max-grammar-compile-seconds: a client that leaves meanwhile abandons it (cancelled while
        still queued), and the engine then finds it in the cache."""
        backend = await asyncio.to_thread(backend_for, self._llm.tokenizer, self._llm.model_config.vocab_size)
        fut = backend.submit(spec)              # GrammarTimeoutError (a ValueError: 400) when refused
        if not isinstance(fut, Future):
            return
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), structured.COMPILE_SECONDS)
        except TimeoutError:
            raise backend.ran_out(spec, fut, structured.COMPILE_SECONDS) from None
        except asyncio.CancelledError:
            backend.abandon(spec, fut)
            raise

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        rid, q = await self.add(prompt_ids, params, request_id)
        finished = False
        try:
            while not finished:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(rid)

    async def score(self, prompts: list[list[int]], k: int) -> list[PromptScores]:
        return await self._run(score_job(self._llm, prompts, k, self._slice))   # type: ignore[no-any-return]

    async def embed(self, prompts: list[list[int]]) -> list[list[float]]:
        return await self._run(pool_job(self._llm, prompts, self._pooling_slice, normalize=True), paced=True)  # type: ignore[no-any-return]

    async def pool(self, prompts: list[list[int]]) -> list[list[float]]:
        return await self._run(pool_job(self._llm, prompts, self._pooling_slice, normalize=False), paced=True)  # type: ignore[no-any-return]

    def _pooling_slice(self) -> int:
        """A pooling forward's tokens: the step's slice, smaller where the pooling share asks it."""
        return self._slice if self._share is None else self._share.slice_tokens(self._slice)

    async def _run(self, job: Any, paced: bool = False) -> Any:
        if not self.is_alive:
            job.close()
            raise RuntimeError("the engine loop is not running")
        return await self._jobs.submit(job, paced)

    def snapshot(self) -> EngineSnapshot:
        return self.engine.snapshot()

    def spec_stats(self) -> Any:
        return getattr(self._llm, "spec_decode", None)

    def set_max_queued(self, n: int | None) -> None:
        self.engine.max_queued_requests = n

    def shutdown(self) -> None:
        self._jobs.close()
        self.engine.shutdown()


def kv_map_of(eng: Any) -> dict[str, Any]:
    """The whole paged cache: blocks that are not pristine-free (``eng``: the engine or a SnapshotView)."""
    kv = eng.kv_manager
    return {"num_blocks": kv.num_blocks, "block_size": kv.block_size, "num_free": kv.num_free_blocks,
            "blocks": [[b.block_id, b.ref_cnt, list(b.owners), b.hashed] for b in kv.snapshot()
                       if b.owners or b.hashed or b.ref_cnt],
            "free_order": list(itertools.islice(kv.pool.free_queue, 64)), "step_counter": eng.step_counter}


class LocalInspector:
    """EngineInspector over an in-process engine (see engine_client.EngineInspector)."""

    def __init__(self, engine: AsyncLLMEngine) -> None:
        self._ae, self._llm = engine, engine.engine

    def subscribe(self, fn: Callable[[EngineEvent], None]) -> Callable[[], None]:
        return self._llm.subscribe(fn)    # type: ignore[no-any-return]

    def trace(self, request_id: str, on: bool) -> None:
        if on:
            self._llm.trace_requests.add(request_id)
            return
        self._llm.trace_requests.discard(request_id)
        self.pop_trace(request_id)

    def pop_trace(self, request_id: str) -> tuple[Any, Any]:
        return self._llm.last_traces.pop(request_id, None), self._llm.last_logits.pop(request_id, None)

    def kv_map(self, live: bool = False) -> dict[str, Any]:
        if live:
            return kv_map_of(self._llm)
        return kv_map_of(SnapshotView(self._llm, self._llm.snapshot(kv_blocks=True)))

    def block_table(self, request_id: str) -> list[int]:
        return list(self._llm.kv_manager.block_table(request_id))

    def step_counter(self) -> int:
        return int(self._llm.step_counter)

    def model(self) -> Any:
        return self._llm.runner.model

    def vision_encoder(self) -> Any:
        cache = self._llm.vision
        return None if cache is None else cache.encoder

    def toy_lookup(self, t2: int, t1: int) -> dict[str, Any] | None:
        model = self._llm.parts.model
        return model.lookup(t2, t1) if hasattr(model, "lookup") else None

    def toy_end_id(self) -> int | None:
        return getattr(self._llm.parts.model, "end_id", None)

    def facts(self) -> dict[str, Any]:
        net, spec = self._llm.runner.model, self._llm.spec
        layer = getattr(net, "layers", [None])[0]
        fmt = f"{type(getattr(layer, 'qkv', net)).__name__} · {getattr(net, 'dtype', '')}".replace("torch.", "")
        return {"weight_format": fmt, "weight_bytes": int(net.weight_bytes()) if hasattr(net, "weight_bytes") else 0,
                "spec": None if spec is None else {"method": spec.method, "k": spec.k},
                "tensor_parallel": self.tp_counters()}

    def tp_counters(self) -> dict[str, Any] | None:
        """A tensor-parallel runner's processes and rank 0's collectives so far (all-reduces, broadcasts,
        gathers: how many and the seconds spent in them); None for one process."""
        runner = self._llm.runner
        group = getattr(getattr(runner, "model", None), "group", None)
        if not hasattr(runner, "comm_seconds") or group is None:
            return None
        return {"size": int(runner.tp_size), "calls": int(group.comm_calls), "seconds": float(runner.comm_seconds)}
