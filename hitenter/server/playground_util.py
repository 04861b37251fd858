"""Helpers of the playground API: SSE framing, token pieces, entropy and the page's view of a
RequestOutput."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import torch

from hitenter.sampling_params import SamplingParams
from hitenter.server.chat_format import chat_format_of

MAX_LOGIT_ROWS = 256      # cached logits rows (one per traced step) kept for the sliders

def _clean(x: Any) -> Any:
    """JSON-safe: dataclasses to dicts, NaN/inf to None, tuples to lists."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _clean(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(_clean(obj), ensure_ascii=False)}\n\n"


def piece(tok: Any, tid: int) -> dict[str, Any]:
    """One token as the page draws it: its exact bytes, as text when they are valid UTF-8."""
    b = tok.token_bytes(tid)
    try:
        text, is_bytes = b.decode("utf-8"), False
    except UnicodeDecodeError:
        text, is_bytes = "".join(f"<0x{c:02X}>" for c in b), True
    return {"id": tid, "text": text, "hex": b.hex(), "special": bool(tok.is_special(tid)), "bytes": is_bytes}


def entropy_bits(logits: torch.Tensor) -> float:
    p = torch.softmax(logits.to(torch.float64), -1)
    return float(-(p[p > 0] * torch.log2(p[p > 0])).sum())


def thinking_split(tok: Any, out: Any, text: str) -> dict[str, str]:
    """A thinking model's reply so far as its two stages, ``thinking`` and ``answer`` (the model's reasoning
    parser over the text; markers made of control tokens read with them); {} for a model without thinking."""
    fmt = chat_format_of(tok) if getattr(tok, "chat_template", None) else None
    if fmt is None or fmt.reasoning is None:
        return {}
    parser = fmt.reasoning.parser(tok.decode(out.prompt_token_ids[-16:], skip_special_tokens=False))
    if parser.needs_special:
        text = tok.decode(out.outputs[0].token_ids, skip_special_tokens=False)
    thinking, answer = parser.split(text)
    return {"thinking": thinking, "answer": answer}


def _output_event(tok: Any, out: Any, params: SamplingParams, t0: float) -> dict[str, Any]:
    """A RequestOutput as the page needs it, with the text still held back for a possible stop string."""
    c = out.outputs[0]
    full = tok.decode(c.token_ids, skip_special_tokens=params.skip_special_tokens)
    held = full[len(c.text):] if full.startswith(c.text) and not c.finished else ""
    ev: dict[str, Any] = {"type": "output", "token_ids": c.token_ids, "text": c.text, "held_back": held,
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                          "num_cached_tokens": out.num_cached_tokens, "finished": out.finished,
                          "logprobs": [{"chosen": p.chosen, "top": p.top} for p in (c.delta_logprobs or [])]}
    ev.update(thinking_split(tok, out, c.text))
    m = out.metrics
    if m is not None:
        ev.update(ttft=m.time_to_first_token, itl=m.inter_token_latencies, num_preemptions=m.num_preemptions)
    last = c.token_ids[-1] if c.token_ids else None
    if c.finish_reason == "stop" and c.stop_reason is None and last in tok.eog_token_ids:
        ev["end_token"] = piece(tok, last)             # stopped on the model's end token (stop_reason is None)
    if c.finished and isinstance(c.stop_reason, str):      # which tokens the stop string spans
        ends = [len(tok.decode(c.token_ids[: i + 1], skip_special_tokens=params.skip_special_tokens))
                for i in range(len(c.token_ids))]
        at = full.find(c.stop_reason, len(c.text))
        if at >= 0:
            first = next(i for i, e in enumerate(ends) if e > at)
            last = next((i for i, e in enumerate(ends) if e >= at + len(c.stop_reason)), len(ends) - 1)
            ev["stop_span"] = [first, last]
    return ev
