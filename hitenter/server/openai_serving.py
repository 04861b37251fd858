"""What OpenAI's /v1/completions and /v1/chat/completions share (vLLM's OpenAIServing):
the sampling fields of both bodies, the field checks and structured output on the SamplingParams, the
prompt scores a request wants (legacy ``echo`` + ``logprobs``, ``max_tokens=0``, vLLM's
``prompt_logprobs``), and the response pieces both build (usage, finish fields, logprobs).

Top-level bodies keep unknown fields in ``model_extra`` so that ``check_known_fields`` refuses them by
name (400, as OpenAI does); nested objects forbid them outright; numbers are strict
(hitenter/server/schema_types.py). Ranges are left to SamplingParams, whose ``ValueError`` messages start
with the field name, which becomes the error's ``param``. JSON has no -inf: a logprob of -inf is sent as
-9999.0 (vLLM clamps the same way).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from annotated_types import MinLen
from pydantic import BaseModel, Field

from hitenter.engine.structured import GuidedSpec
from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server import guided as G
from hitenter.server.api_error import APIError
from hitenter.server.generation import ServedModel
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.reply import ToolPlan
from hitenter.server.schema_types import (
    Bias,
    Bool,
    Count,
    Fraction,
    NonEmpty,
    NonNegInt,
    Penalty,
    PositiveFloat,
    PositiveInt,
    PromptLogprobs,
    Seed,
    Temperature,
    TokenId,
    TokenKey,
    TopK,
    TopP,
)
from hitenter.server.schema_types import Lenient as _Lenient
from hitenter.server.schema_types import Nested as _Nested

METADATA_FIELDS = frozenset({"user"})       # sent by clients as pure metadata (no effect on generation)


def check_known_fields(req: BaseModel) -> None:
    """400 for fields the request model does not define (``extra="allow"`` keeps them in model_extra);
    ``stream_options`` without ``stream`` is a 400 too (as vLLM does)."""
    extra = sorted(set(req.model_extra or {}) - METADATA_FIELDS)
    if extra:
        raise APIError(400, f"{extra[0]}: unsupported request field(s) {extra}; see the README for the fields "
                       "this server implements", extra[0])
    if getattr(req, "stream_options", None) is not None and not getattr(req, "stream", False):
        raise APIError(400, "stream_options: only allowed when stream is true", "stream_options")


class StreamOptions(_Nested):
    include_usage: Bool = False
    continuous_usage_stats: Bool = False     # vLLM's: every chunk carries the usage so far


STRUCTURED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                     "structured_outputs")


class GuidedFields(BaseModel):
    """OpenAI's ``response_format`` and vLLM's guided_* / ``structured_outputs``: at most one."""
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[Annotated[str, MinLen(1)]], MinLen(1)] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None    # vLLM >= 0.10: {json | regex | choice | grammar}
    prompt_logprobs: PromptLogprobs | None = None

    def guided_spec(self) -> GuidedSpec | None:
        if all(getattr(self, f) is None for f in STRUCTURED_FIELDS):
            return None
        return G.one_of([
            ("response_format", G.response_format_spec(self.response_format)),
            ("guided_json", G.schema_spec(self.guided_json, "guided_json")),
            ("guided_regex", G.text_spec("regex", self.guided_regex, "guided_regex")),
            ("guided_choice", G.choice_spec(self.guided_choice, "guided_choice")),
            ("guided_grammar", G.text_spec("grammar", self.guided_grammar, "guided_grammar")),
            ("structured_outputs", G.structured_outputs_spec(self.structured_outputs)),
        ])


class SamplingRequest(GuidedFields, _Lenient):

    model: str | None = None
    n: Count = 1
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: Fraction | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: PositiveFloat | None = None
    # keys other than the pattern's are refused: the schema says so (patternProperties alone admits any)
    logit_bias: Annotated[dict[TokenKey, Bias], Field(json_schema_extra={"additionalProperties": False})] | None = None
    seed: Seed | None = None
    stop: NonEmpty | list[NonEmpty] | None = None
    stop_token_ids: list[TokenId] | None = None
    max_tokens: PositiveInt | None = None
    ignore_eos: Bool = False
    min_tokens: NonNegInt = 0
    include_stop_str_in_output: Bool = False
    skip_special_tokens: Bool = True
    stream: Bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "n": self.n, "temperature": 1.0 if self.temperature is None else self.temperature,
            "seed": self.seed, "stop": self.stop, "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens, "logit_bias": self.logit_bias,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
        }
        for name in ("top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        return kw

    @property
    def echoes_logprobs(self) -> bool:
        """Legacy completions' ``echo`` + ``logprobs``: the prompt's logprobs before the completion's."""
        return False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


# /v1 request bodies refuse fields they do not define (check_known_fields: 400 naming it)
NO_UNKNOWN: dict[str, Any] = {"additionalProperties": False}


def requires_when(field: str, value: Any, then: dict[str, Any], present: bool = False) -> dict[str, Any]:
    """JSON Schema for a rule between fields: when ``field`` is ``value``, ``then`` holds (and its
    fields must be given when ``present``)."""
    rule: dict[str, Any] = {"properties": then, **({"required": list(then)} if present else {})}
    return {"if": {"properties": {field: value}, "required": [field]}, "then": rule}


OK_OR_STREAM = {200: {"content": {"application/json": {}, "text/event-stream": {}},
                      "description": "The completion, or with `stream` its server-sent events"}}


def prepare_params(req: Any, params: SamplingParams, plan: ToolPlan | None = None) -> SamplingParams:
    """400 for unknown fields; the request's structured output (or its tool plan's) on the params."""
    check_known_fields(req)
    spec = req.guided_spec()
    if plan is not None and plan.guided is not None:
        if spec is not None:
            raise APIError(400, f"{spec.param}: cannot be combined with tool_choice {plan.mode!r}", spec.param)
        spec = plan.guided
    if req.stream and req.prompt_logprobs is not None:
        raise APIError(400, "prompt_logprobs: not supported when streaming", "prompt_logprobs")
    if req.stream and req.echoes_logprobs:
        raise APIError(400, "echo: echo with logprobs is not supported when streaming", "echo")
    return params if spec is None else params.replace(guided=spec)


async def scores_for(m: ServedModel, req: Any, prompts: list[list[int]]) -> list[PromptScores] | None:
    """Prompt logprobs when the request wants them (legacy echo+logprobs, or prompt_logprobs)."""
    k = req.prompt_logprobs
    legacy = req.echoes_logprobs
    if k is None and not legacy:
        return None
    if legacy:
        k = max(k or 0, req.logprobs)
    try:
        return await m.client.score(prompts, k or 0)      # engine work, between its steps
    except ValueError as e:
        raise APIError(400, str(e), "prompt") from e


_LOGPROB_FLOOR = -9999.0


TokenBytes = Callable[[int], bytes]


Decode = Callable[[list[int]], str]


SYSTEM_FINGERPRINT = None     # OpenAI's field, present (null: no fixed backend configuration id)


def finite_logprob(x: float) -> float:
    return x if math.isfinite(x) else _LOGPROB_FLOOR


def chat_logprobs(positions: list[PositionLogprobs], token_bytes: Any, k: int) -> dict[str, Any]:
    def entry(token_id: int, token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": finite_logprob(logprob), "bytes": list(token_bytes(token_id))}

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


def vllm_prompt_logprobs(sc: PromptScores, decode: Decode) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: per position null (first) or {token_id: {logprob, rank, decoded_token}}."""
    out: list[dict[str, Any] | None] = []
    for tid, lp in zip(sc.token_ids, sc.logprobs, strict=True):
        if lp is None:
            out.append(None)
            continue
        d = {str(t): {"logprob": finite_logprob(v), "rank": r, "decoded_token": decode([t])} for t, v, r in lp.top}
        d[str(tid)] = {"logprob": finite_logprob(lp.logprob), "rank": lp.rank, "decoded_token": decode([tid])}
        out.append(d)
    return out
