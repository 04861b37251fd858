"""The playground API's request bodies, validated with pydantic: a bad body is a 400 with the reason,
never a 500. The bounds here are the ones stated in the README (Playground section)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_TEXT_CHARS = 8000          # prompt text
MAX_PROMPT_IDS = 4096          # prompt given as ids
MAX_TOKENS = 1024              # max_tokens of a playground request
MAX_BURST = 32                 # burst: concurrent requests
MAX_OTHERS = 16                # determinism: requests beside the measured one
MAX_TRACE_TOKENS = 96          # trace: prompt (+ generated) tokens; attention is [layers, heads, T, T]
MAX_TRACE_NEW = 8              # trace: greedy tokens generated after the prompt

B = TypeVar("B", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PromptBody(_Body):
    model: str | None = None
    text: str = Field("", max_length=MAX_TEXT_CHARS)
    chat: bool = True
    prompt_ids: list[int] | None = Field(None, max_length=MAX_PROMPT_IDS)


class Params(_Body):
    temperature: float | None = Field(None, ge=0, le=100)
    top_k: int | None = Field(None, ge=-1)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    stop: list[str] | str | None = None
    ignore_eos: bool | None = None
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    min_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    stop_token_ids: list[int] | None = Field(None, max_length=64)


class GenerateBody(PromptBody):
    params: Params = Field(default_factory=Params)


class ReshapeBody(_Body):
    model: str | None = None
    request_id: str = Field(max_length=64)
    index: int = Field(0, ge=0, le=MAX_TOKENS)
    params: Params = Field(default_factory=Params)


class BurstBody(PromptBody):
    n: int = Field(4, ge=1, le=MAX_BURST)
    max_tokens: int = Field(24, ge=1, le=MAX_TOKENS)


class DeterminismBody(GenerateBody):
    others: int = Field(4, ge=1, le=MAX_OTHERS)


class TraceBody(PromptBody):
    generate: int = Field(0, ge=0, le=MAX_TRACE_NEW)


class TraceQuery(_Body):
    trace_id: str = Field(max_length=64)
    layer: int = Field(0, ge=0)
    index: int = Field(0, ge=0)         # a token position
    temperature: float = Field(1.0, ge=0, le=100)


class CompareBody(_Body):
    model: str | None = None
    a: str = Field("I went to the bank to deposit money", max_length=400)
    b: str = Field("I sat by the river bank", max_length=400)
    word: str = Field("bank", min_length=1, max_length=40)


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
    positions: int = Field(32, ge=1, le=256)
    max_distance: int = Field(256, ge=1, le=4096)
