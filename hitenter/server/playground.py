"""The playground's API: everything the web page at ``/`` draws comes from here, and everything here
comes from the engine itself, through its EngineClient and that client's ``inspector``
(hitenter/server/engine_client.py): its tokenizer, its per-step ``EngineEvent``s, its sampler traces and
raw logits rows, its KV block map, its RequestOutputs, and traced forwards of its model
(playground_trace.py). Nothing is simulated.

Mount it with ``app.include_router(make_playground_router(clients))`` (EngineClients, or AsyncLLMEngines
which get a local client each) and serve ``WEB_DIR`` at ``/``.
Streams are Server-Sent Events (``data: {json}``); POST streams are read with ``fetch`` on the page.
Bodies are pydantic models (playground_models.py): a bad one is a 400, never a 500.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse

from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.engine.events import EngineEvent
from hitenter.engine.logits_processors import BatchState, default_chain
from hitenter.engine.sampler import reshape_distribution, run_chain
from hitenter.sampling_params import SamplingParams
from hitenter.server.chat_format import chat_format_of
from hitenter.server.engine_client import EngineClient
from hitenter.server.playground_arithmetic import arithmetic_routes
from hitenter.server.playground_models import (
    BurstBody,
    DeterminismBody,
    GenerateBody,
    MeasureBody,
    PromptBody,
    ReshapeBody,
    body_doc,
    parse,
)
from hitenter.server.playground_speculative import speculative_routes
from hitenter.server.playground_state import Playground
from hitenter.server.playground_stream import GenerateStream
from hitenter.server.playground_trace import trace_routes
from hitenter.server.playground_util import entropy_bits, piece, sse
from hitenter.server.playground_vision import vision_routes

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def _info_routes(router: APIRouter, pg: Playground) -> None:
    @router.get("/models")
    async def models() -> list[dict[str, Any]]:
        out = []
        for name, c in pg.engines.items():
            i, tok = c.info, c.tokenizer
            out.append({"name": name, "architecture": i.architecture, "vocab_size": i.vocab_size,
                        "max_model_len": i.max_model_len, "context_length": i.context_length, "block_size": i.block_size, "num_blocks": i.num_blocks,
                        "kv_bytes_per_token": i.kv_bytes_per_token, "trigram": i.toy,
                        "layer_types": list(i.layer_types), "state_bytes_per_sequence": i.state_bytes_per_sequence,
                        "eog": [piece(tok, t) for t in sorted(tok.eog_token_ids)],
                        "thinks": not i.toy and chat_format_of(tok).thinks, "vision": bool(i.vision)})
        return out

    @router.post("/tokenize", openapi_extra=body_doc(PromptBody))
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await parse(request, PromptBody)
        c = pg.engine_of(body.model)
        ids, templ = pg.prompt_ids_of(c, body)
        return {"ids": ids, "pieces": [piece(c.tokenizer, t) for t in ids], "template_used": templ,
                "count": len(ids), "max_model_len": c.info.max_model_len}

    @router.get("/kv")
    async def kv(model: str | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(pg.engine_of(model).inspector.kv_map)


def _sampling_routes(router: APIRouter, pg: Playground) -> None:
    @router.post("/reshape", openapi_extra=body_doc(ReshapeBody))
    async def reshape(request: Request) -> dict[str, Any]:
        """The cached logits of one step through the sampler chain with other params (no model run)."""
        body = await parse(request, ReshapeBody)
        row = pg.rows.get((body.request_id, body.index))
        if row is None:
            raise HTTPException(404, "no cached logits for that step (only recent steps are kept)")
        params, tok = pg.params_of(body.params), pg.engine_of(body.model).tokenizer
        d = reshape_distribution(row["logits"], params, row["prompt"], row["output"])
        _, stages = run_chain(default_chain(), row["logits"].reshape(1, -1),
                              BatchState([params], [row["prompt"]], [row["output"]], [frozenset()]), record=True)
        return {"candidates": [piece(tok, t) for t in d.candidate_ids], "stages": d.stages,
                "entropy": [entropy_bits(x[0]) for _, x in stages], "greedy": params.is_greedy,
                "temperature": params.temperature, "request_id": body.request_id, "index": body.index}

    @router.post("/generate", openapi_extra=body_doc(GenerateBody))
    async def generate(request: Request) -> StreamingResponse:
        received = time.monotonic()           # the page's time to first token counts from here, not the engine's arrival
        body = await parse(request, GenerateBody)
        c = pg.engine_of(body.model)
        prompt, templ = pg.prompt_ids_of(c, body)
        stream = GenerateStream(c, prompt, templ, pg.params_of(body.params), pg.rows, received=received)
        return StreamingResponse(stream.run(), media_type="text/event-stream")

    @router.post("/overflow", openapi_extra=body_doc(GenerateBody))
    async def overflow(request: Request) -> StreamingResponse:
        """The "overflow" break-it on any model: the prompt's own tokens repeated until prompt + max_tokens is
        one token more than the engine's context window, sent as a real request (the engine refuses it)."""
        body = await parse(request, GenerateBody)
        c = pg.engine_of(body.model)
        base, templ = pg.prompt_ids_of(c, body)
        base = base or c.tokenizer.encode(" the") or [0]
        params = pg.params_of(body.params)
        n_ctx = c.info.max_model_len
        max_tokens = max(1, min(params.max_tokens or 24, n_ctx - 1))
        n = n_ctx - max_tokens + 1
        prompt = (base * (n // len(base) + 1))[:n]
        params = pg.params_of(body.params.model_copy(update={"max_tokens": max_tokens}))
        stream = GenerateStream(c, prompt, templ, params, pg.rows)
        return StreamingResponse(stream.run(), media_type="text/event-stream")


def _events_route(router: APIRouter, pg: Playground) -> None:
    @router.get("/events")
    async def events(model: str | None = None) -> StreamingResponse:
        """Every engine step of one model (batch, preemptions, timings) and the KV block map."""
        insp = pg.engine_of(model).inspector

        async def gen() -> Any:
            loop, q = asyncio.get_running_loop(), asyncio.Queue()

            def on_step(ev: EngineEvent) -> None:
                item = {"type": "step", "step_id": ev.step_id, "t_start": ev.t_start, "t_end": ev.t_end,
                        "batch": [[w.request_id, w.kind, w.start, w.num_tokens] for w in ev.work],
                        "accepted": [[w.request_id, len(w.tokens)] for w in ev.work if w.tokens],
                        "finished": ev.finished, "preempted": ev.preempted, "num_running": ev.num_running,
                        "num_waiting": ev.num_waiting, "kv": insp.kv_map(live=True),
                        "kv_events": [e.to_dict() for e in ev.kv_events]}
                loop.call_soon_threadsafe(q.put_nowait, item)

            unsubscribe = insp.subscribe(on_step)
            try:
                last = await asyncio.to_thread(insp.kv_map)
                yield sse({"type": "kv", "kv": last})
                while True:
                    try:
                        item = await asyncio.wait_for(q.get(), 0.5)
                        last = item["kv"]
                    except TimeoutError:           # no step: an abort may still have freed blocks
                        now = await asyncio.to_thread(insp.kv_map)
                        if now == last:
                            yield ": idle\n\n"
                            continue
                        item, last = {"type": "kv", "kv": now}, now
                    yield sse(item)
            finally:
                unsubscribe()

        return StreamingResponse(gen(), media_type="text/event-stream")


def _batch_routes(router: APIRouter, pg: Playground) -> None:
    @router.post("/burst", openapi_extra=body_doc(BurstBody))
    async def burst(request: Request) -> dict[str, Any]:
        """N concurrent requests (different seeds) so continuous batching shows on the block map."""
        body = await parse(request, BurstBody)
        c = pg.engine_of(body.model)
        prompt = pg.prompt_ids_of(c, body)[0]
        room = c.info.max_model_len - len(prompt)
        if room < 1:
            raise HTTPException(400, f"burst: the prompt ({len(prompt)} tokens) fills the context window")
        for i in range(body.n):
            p = SamplingParams(temperature=1.0, seed=1000 + i, max_tokens=max(1, min(body.max_tokens + 4 * i, room)))
            task = asyncio.create_task(pg.run(c, prompt, p))
            pg.background.add(task)
            task.add_done_callback(pg.background.discard)
        return {"started": body.n}

    @router.post("/measure", openapi_extra=body_doc(MeasureBody))
    async def measure(request: Request) -> dict[str, Any]:
        """Batching, measured: ms per decode step with one request, then with n at once (greedy, the prompt
        given), each the median of the engine's own step timestamps."""
        body = await parse(request, MeasureBody)
        c = pg.engine_of(body.model)
        prompt = pg.prompt_ids_of(c, body)[0] or c.tokenizer.encode(" the") or [0]
        room = c.info.max_model_len - len(prompt)
        if room < 2:
            raise HTTPException(400, f"measure: the prompt ({len(prompt)} tokens) leaves no room to decode")
        tokens = min(body.tokens, room)
        try:
            alone = await pg.timed(c, prompt, 1, tokens)
            batched = await pg.timed(c, prompt, body.n, tokens)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        return {"alone": alone, "batched": batched, "tokens": tokens, "n_prompt_tokens": len(prompt)}

    @router.post("/determinism", openapi_extra=body_doc(DeterminismBody))
    async def determinism(request: Request) -> dict[str, Any]:
        """The same prompt and seed alone, then among N others: tokens and logprobs side by side."""
        body = await parse(request, DeterminismBody)
        c = pg.engine_of(body.model)
        prompt, params = pg.prompt_ids_of(c, body)[0], pg.params_of(body.params)
        try:
            alone = await pg.run(c, prompt, params)
            others = [asyncio.create_task(pg.run(c, prompt[: max(1, len(prompt) - 1 - i)] + prompt[-1:],
                                                 SamplingParams(temperature=1.0, seed=i, max_tokens=params.max_tokens or 16)))
                      for i in range(body.others)]
            loaded = await pg.run(c, prompt, params)
            await asyncio.gather(*others)
        except ValueError as e:          # the engine's own refusal (e.g. the window overflows)
            raise HTTPException(400, str(e)) from e

        def view(o: Any) -> dict[str, Any]:
            return {"ids": o.token_ids, "pieces": [piece(c.tokenizer, t) for t in o.token_ids],
                    "logprobs": [p.chosen.logprob for p in o.logprobs or []]}
        return {"alone": view(alone), "loaded": view(loaded), "others": body.others,
                "same_ids": alone.token_ids == loaded.token_ids,
                "same_logprobs": view(alone)["logprobs"] == view(loaded)["logprobs"]}


def make_playground_router(engines: dict[str, EngineClient] | dict[str, AsyncLLMEngine]) -> APIRouter:
    """The playground's routes over these models (an AsyncLLMEngine gets a local client of its own)."""
    from hitenter.server.local_engine import LocalEngineClient

    clients: dict[str, EngineClient] = {
        name: LocalEngineClient(e) if isinstance(e, AsyncLLMEngine) else e for name, e in engines.items()}
    router = APIRouter(prefix="/playground/api")
    pg = Playground(clients)
    for add in (_info_routes, _sampling_routes, _events_route, _batch_routes, speculative_routes):
        add(router, pg)
    traces = trace_routes(router, pg)
    arithmetic_routes(router, traces)
    vision_routes(router, pg, traces)
    return router
