"""The playground API's request bodies, validated with pydantic: a bad body is a 400 with the reason,
never a 500. The bounds here are the ones stated in the README (Playground section)."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from annotated_types import Interval
from fastapi import HTTPException, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError

MAX_TEXT_CHARS = 8000          # prompt text
MAX_PROMPT_IDS = 4096          # prompt given as ids
MAX_TOKENS = 1024              # max_tokens of a playground request
MAX_BURST = 32                 # burst: concurrent requests
MAX_OTHERS = 16                # determinism: requests beside the measured one
MAX_TRACE_TOKENS = 96          # trace: prompt (+ generated) tokens; attention is [layers, heads, T, T]
MAX_TRACE_NEW = 8              # trace: greedy tokens generated after the prompt
MAX_ARITHMETIC_STEPS = 16     # determinism arithmetic: answer steps compared
MAX_MEASURE_N = 16             # measure: requests in the batched run
MAX_MEASURE_TOKENS = 64        # measure: tokens each request decodes
MAX_SPEC_TOKENS = 256          # speculative: tokens each of the two runs decodes
MAX_IMAGE_URL_CHARS = 28_000_000   # image panel: a data URL (the image limit's 20 MiB, base64-encoded)
MAX_IMAGE_TRACE_TOKENS = 400   # image panel: prompt (with the image's rows) + generated tokens traced

B = TypeVar("B", bound=BaseModel)


def _number(v: Any) -> Any:
    """The types the schema states: a JSON number, not a string or a boolean (pydantic's lax mode takes both)."""
    if isinstance(v, (bool, str)):
        raise ValueError("must be a number")
    return v


_NUM = BeforeValidator(_number)       # after the bounds (Interval), so that the schema states them; ints add Strict() (8.0 is no int)
Bool = Annotated[bool, Strict()]
# the served schema bounds token ids by the vocabulary (api._schema_for_served rewrites this bound)
TokenId = Annotated[int, Interval(ge=0, lt=2**31), Strict(), _NUM]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PromptBody(_Body):
    model: str | None = None
    text: str = Field("", max_length=MAX_TEXT_CHARS)
    chat: Bool = True
    prompt_ids: list[TokenId] | None = Field(None, max_length=MAX_PROMPT_IDS)
    think: Bool | None = None      # a thinking model's template switch (enable_thinking); None: its default (on)


class Params(_Body):
    temperature: Annotated[float, Interval(ge=0, le=100), _NUM] | None = None
    top_k: Annotated[int, Interval(ge=-1), Strict(), _NUM] | None = None
    top_p: Annotated[float, Interval(gt=0, le=1), _NUM] | None = None
    min_p: Annotated[float, Interval(ge=0, le=1), _NUM] | None = None
    seed: Annotated[int, Interval(ge=0, le=2**53), Strict(), _NUM] | None = None      # integers JSON carries exactly
    max_tokens: Annotated[int, Interval(ge=1, le=MAX_TOKENS), Strict(), _NUM] | None = None
    stop: list[str] | str | None = None
    ignore_eos: Bool | None = None
    repetition_penalty: Annotated[float, Interval(gt=0, le=10), _NUM] | None = None
    presence_penalty: Annotated[float, Interval(ge=-2, le=2), _NUM] | None = None
    frequency_penalty: Annotated[float, Interval(ge=-2, le=2), _NUM] | None = None
    min_tokens: Annotated[int, Interval(ge=0, le=MAX_TOKENS), Strict(), _NUM] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=64)


class GenerateBody(PromptBody):
    params: Params = Field(default_factory=Params)


class ReshapeBody(_Body):
    model: str | None = None
    request_id: str = Field(max_length=64)
    index: Annotated[int, Interval(ge=0, le=MAX_TOKENS), Strict(), _NUM] = 0
    params: Params = Field(default_factory=Params)


class BurstBody(PromptBody):
    n: Annotated[int, Interval(ge=1, le=MAX_BURST), Strict(), _NUM] = 4
    max_tokens: Annotated[int, Interval(ge=1, le=MAX_TOKENS), Strict(), _NUM] = 24


class DeterminismBody(GenerateBody):
    others: Annotated[int, Interval(ge=1, le=MAX_OTHERS), Strict(), _NUM] = 4


class ArithmeticBody(PromptBody):
    answer: list[TokenId] = Field(min_length=1, max_length=MAX_ARITHMETIC_STEPS)     # the answer's token ids
    others: Annotated[int, Interval(ge=1, le=MAX_OTHERS), Strict(), _NUM] = 4
    near_tie: Bool = True


class MeasureBody(PromptBody):
    n: Annotated[int, Interval(ge=2, le=MAX_MEASURE_N), Strict(), _NUM] = 8
    tokens: Annotated[int, Interval(ge=2, le=MAX_MEASURE_TOKENS), Strict(), _NUM] = 16


class SpeculativeBody(PromptBody):
    tokens: Annotated[int, Interval(ge=2, le=MAX_SPEC_TOKENS), Strict(), _NUM] = 64
    rounds: Annotated[int, Interval(ge=1, le=4), Strict(), _NUM] = 2       # off then on, this many times
    params: Params | None = None     # the sampling of both runs (None: greedy); max_tokens is `tokens`


class TraceBody(PromptBody):
    generate: Annotated[int, Interval(ge=0, le=MAX_TRACE_NEW), Strict(), _NUM] = 0
    # a longer prompt: trace its last MAX_TRACE_TOKENS - generate tokens as a prompt of their own (else a 400)
    last: Bool = False


class ImageBody(_Body):
    model: str | None = None
    image: str = Field(min_length=1, max_length=MAX_IMAGE_URL_CHARS)      # a data:image/...;base64 URL
    text: str = Field("What is in this picture?", max_length=MAX_TEXT_CHARS)
    generate: Annotated[int, Interval(ge=0, le=MAX_TRACE_NEW), Strict(), _NUM] = 4   # greedy tokens traced


class TraceQuery(_Body):
    trace_id: str = Field(max_length=64)
    layer: Annotated[int, Interval(ge=0), Strict(), _NUM] = 0
    index: Annotated[int, Interval(ge=0), Strict(), _NUM] = 0         # a token position
    temperature: Annotated[float, Interval(ge=0, le=100), _NUM] = 1.0


class HeadQuery(TraceQuery):
    head: Annotated[int, Interval(ge=0), Strict(), _NUM] = 0


class CompareBody(_Body):
    model: str | None = None
    a: str = Field("I deposited my money at the bank", max_length=400)     # the clue before the word: a causal
    b: str = Field("we sat on the river bank", max_length=400)            # model reads only what came before
    word: str = Field("bank", min_length=1, max_length=40)


class ProbeBody(_Body):
    model: str | None = None
    word: str = Field(min_length=1, max_length=64)      # a word typed to probe the embedding table


class OrderBody(_Body):
    model: str | None = None
    a: str = Field("the dog bites the man", min_length=1, max_length=400)
    b: str = Field("the man bites the dog", min_length=1, max_length=400)


def body_doc(cls: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a route's JSON body as ``cls`` (the routes read it with ``parse``, so
    FastAPI does not see it): the schema inlined (no $refs), required when ``cls`` has required fields."""
    schema = cls.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    required = bool(schema.get("required"))
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": inline(schema)}}}}


async def parse(request: Request, cls: type[B]) -> B:
    """The JSON body of ``request`` as ``cls``; 400 with pydantic's reasons when it is not one."""
    try:
        raw: Any = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPException(400, f"body: not JSON ({e})") from e
    if not isinstance(raw, dict):
        raise HTTPException(400, "body: expected a JSON object")
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        msg = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise HTTPException(400, msg) from e


class RopeBody(_Body):
    model: str | None = None
    positions: Annotated[int, Interval(ge=1, le=256), Strict(), _NUM] = 32
    max_distance: Annotated[int, Interval(ge=1, le=4096), Strict(), _NUM] = 256
