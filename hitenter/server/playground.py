"""The playground's API: everything the web page at ``/`` draws comes from here, and everything here
comes from the engine itself: its tokenizer, its per-step ``EngineEvent``s (``engine.subscribe``), its
sampler traces (``engine.trace_requests`` / ``last_traces``), its KV manager (``snapshot()``) and its
RequestOutputs. Nothing is simulated.

Mount it with ``app.include_router(make_playground_router(engines))`` and serve ``WEB_DIR`` at ``/``.
Streams are Server-Sent Events (``data: {json}``); POST streams are read with ``fetch`` on the page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import StreamingResponse

from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.engine.events import EngineEvent
from hitenter.engine.logits_processors import BatchState, default_chain
from hitenter.engine.sampler import reshape_distribution, run_chain
from hitenter.errors import ContextOverflowError, HitenterError
from hitenter.sampling_params import SamplingParams
from hitenter.server.playground_util import (
    MAX_LOGIT_ROWS,
    _clean,
    _LogitsTap,
    _output_event,
    entropy_bits,
    piece,
    sse,
)

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
PARAM_KEYS = ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "stop", "ignore_eos",
              "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens", "stop_token_ids")


def make_playground_router(async_engines: dict[str, AsyncLLMEngine]) -> APIRouter:
    router = APIRouter(prefix="/playground/api")
    rows: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()   # (request id, step) -> logits + context
    background: set[asyncio.Task[Any]] = set()
    for ae in async_engines.values():
        _LogitsTap.of(ae.engine)

    def engine_of(name: str | None) -> AsyncLLMEngine:
        if name not in async_engines:
            raise HTTPException(404, f"model: {name!r} is not served; served: {sorted(async_engines)}")
        return async_engines[name]

    def prompt_ids_of(eng: Any, body: dict[str, Any]) -> tuple[list[int], bool]:
        if body.get("prompt_ids"):
            return eng.encode_prompt([int(t) for t in body["prompt_ids"]]), False
        text = str(body.get("text", ""))
        if body.get("chat", True):
            try:
                ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True)
                return list(ids), True
            except Exception:          # no chat template in this model: the raw text it is
                pass
        return eng.tokenizer.encode(text), False

    def params_of(body: dict[str, Any]) -> SamplingParams:
        p = {k: v for k, v in (body.get("params") or {}).items() if k in PARAM_KEYS and v not in (None, "")}
        try:
            return SamplingParams(**p, logprobs=5)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e

    def kv_state(eng: Any) -> dict[str, Any]:
        """The whole paged cache (call with the engine lock held): blocks that are not pristine-free."""
        kv = eng.kv_manager
        snap = kv.snapshot()
        return {"num_blocks": kv.num_blocks, "block_size": kv.block_size, "num_free": kv.num_free_blocks,
                "blocks": [[b.block_id, b.ref_cnt, list(b.owners), b.hashed] for b in snap
                           if b.owners or b.hashed or b.ref_cnt],
                "free_order": list(kv.pool.free_queue)[:64], "step_counter": eng.step_counter}

    @router.get("/models")
    async def models() -> list[dict[str, Any]]:
        out = []
        for name, ae in async_engines.items():
            e = ae.engine
            out.append({"name": name, "architecture": e.model_config.architecture, "vocab_size": e.model_config.vocab_size,
                        "max_model_len": e.max_model_len, "block_size": e.kv_manager.block_size,
                        "num_blocks": e.kv_manager.num_blocks, "kv_bytes_per_token": e.model_config.kv_bytes_per_token(
                            e.runner.kv_caches[0].element_size()), "trigram": hasattr(e.parts.model, "lookup"),
                        "eog": [piece(e.tokenizer, t) for t in sorted(e.tokenizer.eog_token_ids)]})
        return out

    @router.post("/tokenize")
    async def tokenize(body: dict[str, Any]) -> dict[str, Any]:
        eng = engine_of(body.get("model")).engine
        ids, templ = prompt_ids_of(eng, body)
        return {"ids": ids, "pieces": [piece(eng.tokenizer, t) for t in ids], "template_used": templ,
                "count": len(ids), "max_model_len": eng.max_model_len}

    @router.get("/kv")
    async def kv(model: str) -> dict[str, Any]:
        ae = engine_of(model)
        return await asyncio.to_thread(ae.run_locked, kv_state, ae.engine)

    @router.post("/reshape")
    async def reshape(body: dict[str, Any]) -> dict[str, Any]:
        """The cached logits of one step through the sampler chain with other params (no model run)."""
        row = rows.get((str(body.get("request_id")), int(body.get("index", 0))))
        if row is None:
            raise HTTPException(404, "no cached logits for that step (only recent steps are kept)")
        params, tok = params_of(body), engine_of(body.get("model")).engine.tokenizer
        d = reshape_distribution(row["logits"], params, row["prompt"], row["output"])
        _, stages = run_chain(default_chain(), row["logits"].reshape(1, -1),
                              BatchState([params], [row["prompt"]], [row["output"]], [frozenset()]), record=True)
        return {"candidates": [piece(tok, t) for t in d.candidate_ids], "stages": d.stages,
                "entropy": [entropy_bits(x[0]) for _, x in stages], "greedy": params.is_greedy}

    @router.post("/generate")
    async def generate(body: dict[str, Any]) -> StreamingResponse:
        ae = engine_of(body.get("model"))
        eng, tok = ae.engine, ae.engine.tokenizer
        prompt, templ = prompt_ids_of(eng, body)
        params = params_of(body)
        return StreamingResponse(_stream(ae, eng, tok, prompt, templ, params), media_type="text/event-stream")

    async def _stream(ae: AsyncLLMEngine, eng: Any, tok: Any, prompt: list[int], templ: bool,
                      params: SamplingParams) -> Any:
        rid = f"pg-{uuid.uuid4().hex[:10]}"
        loop, q = asyncio.get_running_loop(), asyncio.Queue()
        tokens, tap, model = list(prompt), _LogitsTap.of(eng), eng.parts.model
        per_tok = eng.model_config.kv_bytes_per_token(eng.runner.kv_caches[0].element_size())
        t0 = time.perf_counter()

        def on_step(ev: EngineEvent) -> None:        # engine thread, engine lock held
            mine = next((w for w in ev.work if w.request_id == rid), None)
            if mine is None and rid not in {r for r, _ in ev.finished}:
                return
            item: dict[str, Any] = {
                "type": "step", "step_id": ev.step_id, "t_start": ev.t_start - t0, "t_end": ev.t_end - t0,
                "t_model": ev.t_model, "batch": [[w.request_id, w.kind, w.start, w.num_tokens] for w in ev.work],
                "num_running": ev.num_running, "num_waiting": ev.num_waiting, "preempted": ev.preempted,
                "mine": mine, "kv": kv_state(eng), "block_table": eng.kv_manager.block_table(rid), "freed": False,
                "kv_events": [e.to_dict() for e in ev.kv_events]}
            for e in ev.kv_events:            # finished this step: its table is in the "free" event (tail first)
                if e.kind == "free" and e.request_id == rid:
                    item.update(block_table=list(reversed(e.block_ids)), freed=True)
            if mine is not None:
                item["cached_tokens"] = mine.start + mine.num_tokens
                item["cached_bytes"] = item["cached_tokens"] * per_tok
            if mine is not None and mine.sampled is not None:
                index = len(tokens) - len(prompt)
                trace = eng.last_traces.pop(rid, None)
                logits = tap.latest.pop(rid, None)
                if hasattr(model, "lookup"):
                    t2 = tokens[-2] if len(tokens) > 1 else model.end_id
                    item["lookup"] = model.lookup(t2, tokens[-1])
                    item["lookup_pieces"] = {t: piece(tok, t) for t in {t2, tokens[-1], *dict(
                        item["lookup"]["counts"]), *dict(item["lookup"]["backoff_counts"])}}
                if trace is not None:
                    item["trace"] = {**_clean(trace), "pieces": [piece(tok, t) for t in trace.candidate_ids]}
                if logits is not None:
                    rows[(rid, index)] = {"logits": logits, "prompt": list(prompt), "output": tokens[len(prompt):]}
                    while len(rows) > MAX_LOGIT_ROWS:
                        rows.popitem(last=False)
                    item["entropy"] = entropy_bits(logits)
                item.update(index=index, token=piece(tok, mine.sampled))
                tokens.append(mine.sampled)
            loop.call_soon_threadsafe(q.put_nowait, item)

        eng.trace_requests.add(rid)
        unsubscribe = eng.subscribe(on_step)
        before = eng.step_counter
        start = {"type": "start", "request_id": rid, "prompt_ids": prompt, "template_used": templ,
                 "pieces": [piece(tok, t) for t in prompt], "max_model_len": eng.max_model_len,
                 "params": dataclasses.asdict(params), "kv_bytes_per_token": per_tok,
                 "block_size": eng.kv_manager.block_size, "step_counter": before}
        try:
            try:
                _, outq = ae.add_request(prompt, params, request_id=rid)
            except (ContextOverflowError, HitenterError, ValueError) as e:
                await asyncio.sleep(0.2)        # give the engine loop a chance to prove it does nothing
                yield sse({**start, "type": "error", "error": str(e), "kind": type(e).__name__,
                           "n_prompt_tokens": getattr(e, "n_prompt_tokens", len(prompt)),
                           "n_ctx": getattr(e, "n_ctx", eng.max_model_len), "max_tokens": getattr(e, "max_tokens", None),
                           "step_counter_after": eng.step_counter})
                return
            yield sse(start)

            async def forward() -> None:       # outputs join the step events, in the engine's order
                while not isinstance(out := await outq.get(), BaseException) and not out.finished:
                    await q.put(out)
                await q.put(out)

            fwd = asyncio.create_task(forward())
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    yield sse({"type": "error", "error": str(item), "kind": type(item).__name__})
                    return
                if isinstance(item, dict):
                    yield sse(item)
                    continue
                yield sse(_output_event(tok, item, params, t0))
                if item.finished:
                    await fwd
                    await asyncio.sleep(0)                # let the last step event arrive first
                    while not q.empty():
                        extra = q.get_nowait()
                        if isinstance(extra, dict):
                            yield sse(extra)
                    yield sse({"type": "done", "request_id": rid, "step_counter": eng.step_counter})
                    return
        finally:
            unsubscribe()
            eng.trace_requests.discard(rid)
            eng.last_traces.pop(rid, None)
            tap.latest.pop(rid, None)
            ae.abort(rid)

    @router.get("/events")
    async def events(model: str) -> StreamingResponse:
        """Every engine step of one model (batch, preemptions, timings) and the KV block map."""
        ae = engine_of(model)
        eng = ae.engine

        async def gen() -> Any:
            loop, q = asyncio.get_running_loop(), asyncio.Queue()

            def on_step(ev: EngineEvent) -> None:
                item = {"type": "step", "step_id": ev.step_id, "t_start": ev.t_start, "t_end": ev.t_end,
                        "batch": [[w.request_id, w.kind, w.start, w.num_tokens] for w in ev.work],
                        "finished": ev.finished, "preempted": ev.preempted, "num_running": ev.num_running,
                        "num_waiting": ev.num_waiting, "kv": kv_state(eng),
                        "kv_events": [e.to_dict() for e in ev.kv_events]}
                loop.call_soon_threadsafe(q.put_nowait, item)

            unsubscribe = eng.subscribe(on_step)
            try:
                last = await asyncio.to_thread(ae.run_locked, kv_state, eng)
                yield sse({"type": "kv", "kv": last})
                while True:
                    try:
                        item = await asyncio.wait_for(q.get(), 0.5)
                        last = item["kv"]
                    except TimeoutError:           # no step: an abort may still have freed blocks
                        now = await asyncio.to_thread(ae.run_locked, kv_state, eng)
                        if now == last:
                            yield ": idle\n\n"
                            continue
                        item = {"type": "kv", "kv": now}
                        last = now
                    yield sse(item)
            finally:
                unsubscribe()

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def _run(ae: AsyncLLMEngine, prompt: list[int], params: SamplingParams) -> Any:
        last = None
        async for out in ae.generate(prompt, params):
            last = out
        return last

    @router.post("/burst")
    async def burst(body: dict[str, Any]) -> dict[str, Any]:
        """N concurrent requests (different seeds) so continuous batching shows on the block map."""
        ae = engine_of(body.get("model"))
        n, prompt = max(1, min(int(body.get("n", 4)), 32)), prompt_ids_of(ae.engine, body)[0]
        room = ae.engine.max_model_len - len(prompt)
        for i in range(n):
            p = SamplingParams(temperature=1.0, seed=1000 + i,
                               max_tokens=max(1, min(int(body.get("max_tokens", 24)) + 4 * i, room)))
            task = asyncio.create_task(_run(ae, prompt, p))
            background.add(task)
            task.add_done_callback(background.discard)
        return {"started": n}

    @router.post("/determinism")
    async def determinism(body: dict[str, Any]) -> dict[str, Any]:
        """The same prompt and seed alone, then among N others: tokens and logprobs side by side."""
        ae = engine_of(body.get("model"))
        prompt, params = prompt_ids_of(ae.engine, body)[0], params_of(body)
        n = max(1, min(int(body.get("others", 4)), 32))
        alone = await _run(ae, prompt, params)
        others = [asyncio.create_task(_run(ae, prompt[: max(1, len(prompt) - 1 - i)] + prompt[-1:],
                                           SamplingParams(temperature=1.0, seed=i, max_tokens=params.max_tokens or 16)))
                  for i in range(n)]
        loaded = await _run(ae, prompt, params)
        await asyncio.gather(*others)

        def view(o: Any) -> dict[str, Any]:
            return {"ids": o.token_ids, "pieces": [piece(ae.engine.tokenizer, t) for t in o.token_ids],
                    "logprobs": [p.chosen.logprob for p in o.logprobs or []]}
        return {"alone": view(alone), "loaded": view(loaded), "others": n,
                "same_ids": alone.token_ids == loaded.token_ids,
                "same_logprobs": [p.chosen.logprob for p in alone.logprobs] == [p.chosen.logprob for p in loaded.logprobs]}

    return router
