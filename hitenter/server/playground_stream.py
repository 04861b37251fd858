"""The playground's /generate stream: one request's engine steps, sampler traces, raw logits rows and
RequestOutputs merged into one SSE stream, in the engine's order."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import OrderedDict
from typing import Any

from hitenter.engine.events import EngineEvent
from hitenter.errors import ContextOverflowError, HitenterError
from hitenter.sampling_params import SamplingParams
from hitenter.server.engine_client import EngineClient
from hitenter.server.playground_util import (
    MAX_LOGIT_ROWS,
    _clean,
    _output_event,
    entropy_bits,
    piece,
    sse,
)


class GenerateStream:
    """One traced request. ``rows`` is the router's shared cache of logits rows (for /reshape)."""

    def __init__(self, client: EngineClient, prompt: list[int], templ: bool, params: SamplingParams,
                 rows: OrderedDict[tuple[str, int], dict[str, Any]], received: float | None = None) -> None:
        self.client, self.insp, self.tok = client, client.inspector, client.tokenizer
        self.prompt, self.templ, self.params, self.rows = prompt, templ, params, rows
        self.rid = f"pg-{uuid.uuid4().hex[:10]}"
        self.tokens = list(prompt)
        self.per_tok = client.info.kv_bytes_per_token
        self.t0 = time.perf_counter()
        self.received = received          # time.monotonic() when the server got the HTTP request, if known
        self.tp0 = self.insp.tp_counters()     # a tensor-parallel engine's collectives before the request
        self.q: asyncio.Queue[Any] = asyncio.Queue()
        self.loop: asyncio.AbstractEventLoop | None = None

    def _sampled(self, item: dict[str, Any], mine: Any) -> None:
        """The fields of a step that sampled a token for this request (engine thread)."""
        tok = self.tok
        index = len(self.tokens) - len(self.prompt)
        trace, logits = self.insp.pop_trace(self.rid)
        if self.client.info.toy:
            t2 = self.tokens[-2] if len(self.tokens) > 1 else self.insp.toy_end_id()
            item["lookup"] = self.insp.toy_lookup(t2, self.tokens[-1])   # type: ignore[arg-type]
            item["lookup_pieces"] = {t: piece(tok, t) for t in {t2, self.tokens[-1], *dict(
                item["lookup"]["counts"]), *dict(item["lookup"]["backoff_counts"])}}
        if trace is not None:
            item["trace"] = {**_clean(trace), "pieces": [piece(tok, t) for t in trace.candidate_ids]}
        if logits is not None:
            self.rows[(self.rid, index)] = {"logits": logits, "prompt": list(self.prompt),
                                            "output": self.tokens[len(self.prompt):]}
            while len(self.rows) > MAX_LOGIT_ROWS:
                self.rows.popitem(last=False)
            item["entropy"] = entropy_bits(logits)
        # speculative decoding: several tokens in one step (the accepted drafts, then one of the model's own)
        item.update(index=index, token=piece(tok, mine.sampled), accepted=len(mine.tokens) or 1,
                    more=[piece(tok, t) for t in mine.tokens[1:]])
        self.tokens.extend(mine.tokens or [mine.sampled])

    def on_step(self, ev: EngineEvent) -> None:
        """Engine thread: this request's view of one engine step."""
        rid = self.rid
        mine = next((w for w in ev.work if w.request_id == rid), None)
        if mine is None and rid not in {r for r, _ in ev.finished}:
            return
        item: dict[str, Any] = {
            "type": "step", "step_id": ev.step_id, "t_start": ev.t_start - self.t0, "t_end": ev.t_end - self.t0,
            "t_model": ev.t_model, "batch": [[w.request_id, w.kind, w.start, w.num_tokens] for w in ev.work],
            "num_running": ev.num_running, "num_waiting": ev.num_waiting, "preempted": ev.preempted,
            "mine": mine, "block_table": self.insp.block_table(rid), "freed": False,
            "kv_events": [e.to_dict() for e in ev.kv_events]}
        for e in ev.kv_events:            # finished this step: its table is in the "free" event (tail first)
            if e.kind == "free" and e.request_id == rid:
                item.update(block_table=list(reversed(e.block_ids)), freed=True)
        if mine is not None:
            item["cached_tokens"] = mine.start + mine.num_tokens
            item["cached_bytes"] = item["cached_tokens"] * self.per_tok
        if mine is not None and mine.sampled is not None:
            self._sampled(item, mine)
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.q.put_nowait, item)

    def _start_event(self, before: int) -> dict[str, Any]:
        return {"type": "start", "request_id": self.rid, "prompt_ids": self.prompt, "template_used": self.templ,
                "pieces": [piece(self.tok, t) for t in self.prompt], "max_model_len": self.client.info.max_model_len,
                "params": dataclasses.asdict(self.params), "kv_bytes_per_token": self.per_tok,
                "block_size": self.client.info.block_size, "step_counter": before}

    async def run(self) -> Any:
        """The SSE stream: start (or a rejection), then steps and outputs in the engine's order, then done."""
        rid, insp = self.rid, self.insp
        self.loop = asyncio.get_running_loop()
        insp.trace(rid, True)
        unsubscribe = insp.subscribe(self.on_step)
        start = self._start_event(insp.step_counter())
        try:
            try:
                _, outq = await self.client.add(self.prompt, self.params, request_id=rid)
            except (ContextOverflowError, HitenterError, ValueError) as e:
                await asyncio.sleep(0.2)        # give the engine loop a chance to prove it does nothing
                yield sse({**start, "type": "error", "error": str(e), "kind": type(e).__name__,
                           "overflow": isinstance(e, ContextOverflowError),
                           "n_prompt_tokens": getattr(e, "n_prompt_tokens", len(self.prompt)),
                           "n_ctx": getattr(e, "n_ctx", self.client.info.max_model_len),
                           "max_tokens": getattr(e, "max_tokens", None),
                           "step_counter_after": insp.step_counter()})
                return
            yield sse(start)
            async for chunk in self._merge(outq):
                yield chunk
        finally:
            unsubscribe()
            insp.trace(rid, False)
            self.client.abort(rid)

    def _output(self, out: Any) -> dict[str, Any]:
        """An output event (with the prefill worker's timings when the engine is disaggregated); with ``before_engine``: seconds from the server receiving the request (parsing, chat
        template, tokenizer) to the engine's arrival time, which the engine's time to first token leaves out."""
        ev = _output_event(self.tok, out, self.params, self.t0)
        if out.extra.get("disaggregated"):    # prefilled by the worker process: its own timings and the KV shipped
            ev["disaggregated"] = out.extra["disaggregated"]
        if self.received is not None and out.metrics is not None:
            ev["before_engine"] = max(0.0, out.metrics.arrival_time - self.received)
        if self.tp0 is not None and out.finished:     # the processes' messages while it ran (its steps, and any
            tp = self.insp.tp_counters() or self.tp0      # other request's that shared them)
            ev["tensor_parallel"] = {"size": tp["size"], "calls": tp["calls"] - self.tp0["calls"],
                                     "seconds": tp["seconds"] - self.tp0["seconds"]}
        return ev

    async def _merge(self, outq: asyncio.Queue[Any]) -> Any:
        async def forward() -> None:       # outputs join the step events, in the engine's order
            while not isinstance(out := await outq.get(), BaseException) and not out.finished:
                await self.q.put(out)
            await self.q.put(out)

        fwd = asyncio.create_task(forward())
        while True:
            item = await self.q.get()
            if isinstance(item, BaseException):
                yield sse({"type": "error", "error": str(item), "kind": type(item).__name__})
                return
            if isinstance(item, dict):
                yield sse(item)
                continue
            yield sse(self._output(item))
            if item.finished:
                await fwd
                await asyncio.sleep(0)                # let the last step event arrive first
                while not self.q.empty():
                    extra = self.q.get_nowait()
                    if isinstance(extra, dict):
                        yield sse(extra)
                yield sse({"type": "done", "request_id": self.rid, "step_counter": self.insp.step_counter()})
                return
