"""What the playground's routes share (playground.py, playground_trace.py): the served models' clients, the
cached logits rows, the background tasks, and the helpers that read a body's model, prompt and sampling."""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections import OrderedDict
from typing import Any

from fastapi import HTTPException

from hitenter.engine.events import EngineEvent
from hitenter.sampling_params import SamplingParams
from hitenter.server.chat_format import chat_format_of
from hitenter.server.engine_client import EngineClient
from hitenter.server.playground_models import Params, PromptBody


class Playground:
    """What the routes share: the served models' clients, the cached logits rows, the background tasks."""

    def __init__(self, clients: dict[str, EngineClient]) -> None:
        self.engines = clients
        self.rows: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()   # (request id, step) -> logits
        self.background: set[asyncio.Task[Any]] = set()

    def engine_of(self, name: str | None) -> EngineClient:
        if name not in self.engines:
            raise HTTPException(404, f"model: {name!r} is not served; served: {sorted(self.engines)}")
        return self.engines[name]

    def prompt_ids_of(self, client: EngineClient, body: PromptBody) -> tuple[list[int], bool]:
        vocab, tok = client.info.vocab_size, client.tokenizer
        if body.prompt_ids:
            bad = [t for t in body.prompt_ids if not 0 <= t < vocab]
            if bad:
                raise HTTPException(400, f"prompt_ids: {bad[:4]} outside the vocabulary [0, {vocab})")
            return list(body.prompt_ids), False
        if body.chat and not client.info.toy:   # the trigram toy never saw a chat template
            try:
                ids = tok.apply_chat_template([{"role": "user", "content": body.text}], tokenize=True,
                                              **chat_format_of(tok).template_kwargs(body.think, None))
                return list(ids), True
            except Exception:          # no chat template in this model: the raw text it is
                pass
        return tok.encode(body.text), False

    @staticmethod
    def params_of(p: Params) -> SamplingParams:
        kw = {k: v for k, v in p.model_dump().items() if v not in (None, "")}
        try:
            return SamplingParams(**kw, logprobs=5)
        except (ValueError, TypeError) as e:
            raise HTTPException(400, str(e)) from e

    async def run(self, client: EngineClient, prompt: list[int], params: SamplingParams,
                  request_id: str | None = None) -> Any:
        last = None
        async for out in client.generate(prompt, params, request_id=request_id):
            last = out
        return last

    async def timed(self, client: EngineClient, prompt: list[int], n: int, tokens: int) -> dict[str, Any]:
        """``n`` greedy requests decoding ``tokens`` tokens each, all at once, and the engine's own timings of
        the decode steps that ran exactly those ``n`` (steps shared with anyone else's requests are left out)."""
        tag = f"pgm-{uuid.uuid4().hex[:8]}"
        rids = [f"{tag}-{i}" for i in range(n)]
        mine, steps = set(rids), []

        def on_step(ev: EngineEvent) -> None:
            if len(ev.work) == n and all(w.request_id in mine and w.kind == "decode" for w in ev.work):
                steps.append((ev.t_end - ev.t_start, sum(len(w.tokens) or 1 for w in ev.work)))

        unsubscribe = client.inspector.subscribe(on_step)
        try:
            p = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
            await asyncio.gather(*(self.run(client, prompt, p, rid) for rid in rids))
        finally:
            unsubscribe()
        if not steps:
            return {"n": n, "steps": 0, "ms_per_step": None, "tokens_per_step": None, "tokens_per_s": None}
        ms = 1000 * statistics.median(t for t, _ in steps)
        per_step = statistics.mean(k for _, k in steps)
        return {"n": n, "steps": len(steps), "ms_per_step": ms, "tokens_per_step": per_step,
                "tokens_per_s": 1000 * per_step / ms}
