"""OpenAI's response shapes built from engine outputs: completion and chat bodies, their stream chunks,
logprobs (the legacy completions form, chat's ``content`` form, vLLM's ``prompt_logprobs``), usage
(also as a stream goes: ``continuous_usage_stats``) and ``finish_reason`` / ``stop_reason``.

JSON has no -inf: a logprob of -inf is sent as -9999.0 (vLLM clamps the same way).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.schema_types import new_id, now
from hitenter.server.streams import Source

_LOGPROB_FLOOR = -9999.0
TokenBytes = Callable[[int], bytes]
Decode = Callable[[list[int]], str]
SYSTEM_FINGERPRINT = None     # OpenAI's field, present (null: no fixed backend configuration id)


def _lp(x: float) -> float:
    return x if math.isfinite(x) else _LOGPROB_FLOOR


def completion_logprobs(positions: list[PositionLogprobs], offset: int) -> dict[str, Any]:
    """Legacy completions shape; ``offset`` is the text length before the first of these tokens."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for pos in positions:
        tokens.append(pos.chosen.token)
        token_lps.append(_lp(pos.chosen.logprob))
        top = {t.token: _lp(t.logprob) for t in pos.top}
        top.setdefault(pos.chosen.token, _lp(pos.chosen.logprob))
        tops.append(top)
        offsets.append(offset)
        offset += len(pos.chosen.token)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(positions: list[PositionLogprobs], token_bytes: Any, k: int) -> dict[str, Any]:
    def entry(token_id: int, token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": _lp(logprob), "bytes": list(token_bytes(token_id))}

    content = []
    for pos in positions:
        e = entry(pos.chosen.token_id, pos.chosen.token, pos.chosen.logprob)
        e["top_logprobs"] = [entry(t.token_id, t.token, t.logprob) for t in pos.top[:k]]
        content.append(e)
    return {"content": content}


def usage(outs: list[RequestOutput]) -> dict[str, Any]:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class UsageSoFar:
    """Token counts as a stream goes (``stream_options.continuous_usage_stats``): every output seen."""

    def __init__(self, prompt_tokens: dict[int, int] | None = None) -> None:
        self.prompt: dict[int, int] = dict(prompt_tokens or {})
        self.completion = 0

    def add(self, i: int, out: RequestOutput) -> None:
        self.prompt.setdefault(i, len(out.prompt_token_ids))
        self.completion += sum(len(c.delta_token_ids) for c in out.outputs)

    def usage(self) -> dict[str, int]:
        p = sum(self.prompt.values())
        return {"prompt_tokens": p, "completion_tokens": self.completion, "total_tokens": p + self.completion}


def finish_fields(finish_reason: str | None, stop_reason: int | str | None) -> dict[str, Any]:
    fr = finish_reason if finish_reason in (None, "stop", "length") else "stop"
    return {"finish_reason": fr, "stop_reason": stop_reason if fr is not None else None}


def _tok_len(positions: list[PositionLogprobs] | None) -> int:
    return sum(len(p.chosen.token) for p in positions or [])


def build_completion(outs: list[RequestOutput], model: str, n: int, echo: list[str]) -> dict[str, Any]:
    choices = []
    for i, out in enumerate(outs):
        for c in out.outputs:
            lps = None if c.logprobs is None else completion_logprobs(c.logprobs, len(echo[i]))
            choices.append({"index": i * n + c.index, "text": echo[i] + c.text, "logprobs": lps,
                            **finish_fields(c.finish_reason, c.stop_reason)})
    return {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(outs)}


def build_chat(outs: list[RequestOutput], model: str, k: int, token_bytes: TokenBytes) -> dict[str, Any]:
    choices = []
    for c in outs[0].outputs:
        lps = None if c.logprobs is None else chat_logprobs(c.logprobs, token_bytes, k)
        choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": lps,
                        **finish_fields(c.finish_reason, c.stop_reason)})
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(outs)}


async def stream_completion(src: Source, model: str, n: int, echo: list[str], include_usage: bool,
                            continuous: bool = False) -> AsyncIterator[dict[str, Any]]:
    """Completion chunks; ``continuous``: each carries the usage so far (vLLM's continuous_usage_stats)."""
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model}
    tok_offset: dict[int, int] = {}
    done: set[int] = set()
    finals: dict[int, RequestOutput] = {}
    so_far = UsageSoFar()
    async for i, out in src:
        so_far.add(i, out)
        if out.finished:
            finals[i] = out
        for c in out.outputs:
            idx = i * n + c.index
            if idx in done:
                continue
            text = c.delta_text
            if idx not in tok_offset:
                tok_offset[idx] = len(echo[i])
                text = echo[i] + text
            lps = None
            if c.delta_logprobs:
                lps = completion_logprobs(c.delta_logprobs, tok_offset[idx])
                tok_offset[idx] += _tok_len(c.delta_logprobs)
            if not (text or lps or c.finish_reason):
                continue
            if c.finish_reason:
                done.add(idx)
            chunk = {**head, "choices": [{"index": idx, "text": text, "logprobs": lps,
                                          **finish_fields(c.finish_reason, c.stop_reason)}]}
            yield {**chunk, "usage": so_far.usage()} if continuous else chunk
    if include_usage:
        yield {**head, "choices": [], "usage": usage([finals[i] for i in sorted(finals)])}


async def stream_chat(src: Source, model: str, n: int, k: int, token_bytes: TokenBytes, include_usage: bool,
                      continuous: bool = False, prompt_tokens: int = 0) -> AsyncIterator[dict[str, Any]]:
    """Chat chunks: a role chunk per choice, content deltas, finish; ``continuous`` as in stream_completion
    (``prompt_tokens``: the prompt's length, for the role chunks' usage)."""
    head = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": now(), "model": model}
    so_far = UsageSoFar({0: prompt_tokens})
    extra: Callable[[], dict[str, Any]] = (lambda: {"usage": so_far.usage()}) if continuous else dict
    for idx in range(n):
        yield {**head, "choices": [{"index": idx, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}], **extra()}
    done: set[int] = set()
    final: list[RequestOutput] = []
    async for _, out in src:
        so_far.add(0, out)
        if out.finished:
            final = [out]
        for c in out.outputs:
            if c.index in done:
                continue
            lps = chat_logprobs(c.delta_logprobs, token_bytes, k) if c.delta_logprobs else None
            if not (c.delta_text or lps or c.finish_reason):
                continue
            if c.finish_reason:
                done.add(c.index)
            delta = {"content": c.delta_text} if c.delta_text else {}
            yield {**head, "choices": [{"index": c.index, "delta": delta, "logprobs": lps,
                                        **finish_fields(c.finish_reason, c.stop_reason)}], **extra()}
    if include_usage:
        yield {**head, "choices": [], "usage": usage(final)}


def legacy_prompt_logprobs(sc: PromptScores, decode: Decode) -> dict[str, Any]:
    """The completions ``logprobs`` object of an echoed prompt: leading null, tokens, text_offset."""
    tokens, lps, tops, offsets, offset = [], [], [], [], 0
    for tid, lp in zip(sc.token_ids, sc.logprobs, strict=True):
        piece = decode([tid])
        tokens.append(piece)
        offsets.append(offset)
        offset += len(piece)
        if lp is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(_lp(lp.logprob))
        top = {decode([t]): _lp(v) for t, v, _ in lp.top}
        top.setdefault(piece, _lp(lp.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def vllm_prompt_logprobs(sc: PromptScores, decode: Decode) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: per position null (first) or {token_id: {logprob, rank, decoded_token}}."""
    out: list[dict[str, Any] | None] = []
    for tid, lp in zip(sc.token_ids, sc.logprobs, strict=True):
        if lp is None:
            out.append(None)
            continue
        d = {str(t): {"logprob": _lp(v), "rank": r, "decoded_token": decode([t])} for t, v, r in lp.top}
        d[str(tid)] = {"logprob": _lp(lp.logprob), "rank": lp.rank, "decoded_token": decode([tid])}
        out.append(d)
    return out
