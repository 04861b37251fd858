"""Speculative decoding on and off, measured: the same prompt run twice on the served model, first with the
request opted out of speculation (``SamplingParams.speculate=False``: plain decoding, one token a step),
then with it on, one after the other so that neither shares the engine with the other; ``rounds`` times
in turn (off, on, off, on, ...), each side's fastest run kept (the one least slowed by the rest of the
machine), every round's times returned beside it.

Each run's speed is the engine's own clock: tokens after the first over the time from the end of the step
that sampled the first token to the end of the step that sampled the last (``EngineEvent`` timestamps of
the steps that worked on this request: the proposer's drafting, the verification pass and the sampling all
inside them). The answer says whether both runs emitted the same token ids (they must: verification keeps
exactly the target's tokens), the speedup (plain time / speculative time for the same tokens) and what the
proposer did for the speculative run (tokens drafted, accepted, verification passes).

A model served without speculation is a 400 naming the option that turns it on; the page asks ``/fast``
(``spec_stats`` null) first and says so instead.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from hitenter.engine.events import EngineEvent
from hitenter.sampling_params import SamplingParams
from hitenter.server.engine_client import EngineClient
from hitenter.server.playground_models import SpeculativeBody, body_doc, parse
from hitenter.server.playground_state import Playground
from hitenter.server.playground_util import piece

HOW_TO_START = "hitenter serve <model> --speculative-method ngram (prompt lookup: no second model)"


def _timed_steps(ends: list[tuple[float, int]]) -> dict[str, Any]:
    """Speed from the (t_end, tokens) of the steps that sampled this request's tokens, in order."""
    if not ends:
        return {"steps": 0, "decode_s": None, "tokens_per_s": None, "tokens_per_step": None}
    after = sum(k for _, k in ends[1:])                       # tokens after the first step's
    span = ends[-1][0] - ends[0][0]
    return {"steps": len(ends), "decode_s": span, "tokens_per_s": after / span if span > 0 else None,
            "tokens_per_step": after / (len(ends) - 1) if len(ends) > 1 else None}


async def _run(pg: Playground, c: EngineClient, prompt: list[int], p: SamplingParams) -> dict[str, Any]:
    """One request with its step timestamps (engine clock) and its output."""
    rid = f"pgs-{uuid.uuid4().hex[:8]}"
    ends: list[tuple[float, int]] = []
    shared = [0]

    def on_step(ev: EngineEvent) -> None:
        for w in ev.work:
            if w.request_id == rid and (w.tokens or w.sampled is not None):
                ends.append((ev.t_end, len(w.tokens) or 1))
                shared[0] += len(ev.work) > 1
    unsubscribe = c.inspector.subscribe(on_step)
    try:
        out = await pg.run(c, prompt, p, rid)
    finally:
        unsubscribe()
    o = out.outputs[0]
    spec = out.extra.get("spec_decode") if out.extra else None
    return {"ids": list(o.token_ids), "text": o.text, "finish": o.finish_reason, **_timed_steps(ends),
            "shared_steps": shared[0], "spec": spec}


def _fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the shortest decode time (the one least slowed by whatever else the machine ran)."""
    timed = [r for r in runs if r["decode_s"]]
    return min(timed, key=lambda r: r["decode_s"]) if timed else runs[0]


def speculative_routes(router: APIRouter, pg: Playground) -> None:
    @router.post("/speculative", openapi_extra=body_doc(SpeculativeBody))
    async def speculative(request: Request) -> dict[str, Any]:
        """The prompt decoded with speculation off, then on: both outputs, their speeds and the speedup."""
        body = await parse(request, SpeculativeBody)
        c = pg.engine_of(body.model)
        if c.spec_stats() is None:
            raise HTTPException(400, f"speculative: {body.model or 'this model'} is served without speculative "
                                     f"decoding; start it with {HOW_TO_START}")
        prompt = pg.prompt_ids_of(c, body)[0]
        room = c.info.max_model_len - len(prompt)
        if not prompt or room < 2:
            raise HTTPException(400, f"speculative: the prompt ({len(prompt)} tokens) leaves no room to decode")
        base = pg.params_of(body.params) if body.params is not None else SamplingParams(temperature=0)
        p = dataclasses.replace(base, max_tokens=min(body.tokens, room), ignore_eos=True, logprobs=None)
        offs, ons = [], []
        try:
            for _ in range(body.rounds):         # off, on, off, on, ...: a busy machine slows both alike
                offs.append(await _run(pg, c, prompt, dataclasses.replace(p, speculate=False)))
                ons.append(await _run(pg, c, prompt, p))
        except ValueError as e:                  # the engine's own refusal
            raise HTTPException(400, str(e)) from e
        off, on = _fastest(offs), _fastest(ons)
        speedup = (off["decode_s"] / on["decode_s"]) if off["decode_s"] and on["decode_s"] else None
        same = all(r["ids"] == offs[0]["ids"] for r in offs + ons)
        return {"off": off, "on": on, "same_ids": same, "speedup": speedup, "rounds": body.rounds,
                "round_s": [[a["decode_s"], b["decode_s"]] for a, b in zip(offs, ons, strict=True)],
                "tokens": len(on["ids"]), "n_prompt_tokens": len(prompt), "spec": c.inspector.facts().get("spec"),
                "pieces": [piece(c.tokenizer, t) for t in on["ids"]]}
