"""Token-level stop checks (stop strings are the detokenizer's job: hitenter.tokenizer.detokenizer).

Contract of :func:`check_token_stop`, called once per sampled token *after* it was appended to the
output (``num_output_tokens`` counts it):

1. an end-of-generation id (``eog_ids``), unless ``params.ignore_eos``  -> ``("stop", None)``
2. an id in ``params.stop_token_ids``                                  -> ``("stop", token_id)``
3. ``num_output_tokens >= max_tokens``                                  -> ``("length", None)``
4. otherwise ``None``.

Checks 1-2 are off while ``num_output_tokens <= params.min_tokens`` (the first ``min_tokens`` tokens
cannot stop the request; the sampler suppresses those ids for exactly these positions). A stop token
that is also the last allowed token reports "stop", not "length". ``finish_reason`` is only ever
"stop" or "length" ("abort" is the engine's).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from hitenter.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hitenter.request import Request

StopResult = tuple[str, int | str | None]


def check_token_stop(token_id: int, num_output_tokens: int, params: SamplingParams,
                     eog_ids: Collection[int], max_tokens: int | None) -> StopResult | None:
    """``(finish_reason, stop_reason)`` when ``token_id`` ends the request, else None (see module doc)."""
    if num_output_tokens > params.min_tokens:
        if not params.ignore_eos and token_id in eog_ids:
            return ("stop", None)
        if token_id in (params.stop_token_ids or ()):
            return ("stop", token_id)
    if max_tokens is not None and num_output_tokens >= max_tokens:
        return ("length", None)
    return None


def append_until_stop(req: Request, tokens: Sequence[int]) -> StopResult | None:
    """Append ``tokens`` to the request's output in order, up to the first that stops it (its stop, or None)."""
    out, params = req.output_token_ids, req.sampling_params
    for tok in tokens:
        out.append(tok)
        stop = check_token_stop(tok, len(out), params, req.eos_token_ids, req.max_tokens)
        if stop is not None:
            return stop
    return None
