"""The strict scalar types every request schema of every surface uses (OpenAI, Anthropic, Ollama,
the playground's own).

Numbers are strict (pydantic's ``Strict``, checked in pydantic-core: no Python runs per field): a string
is never a number, a float never an integer, ``true`` never 1 (a float field still takes an integer). Constraints (``Interval``) come first so that the JSON schema states
them. ``Nested`` is the base of every object inside a body: an unknown key is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated

from annotated_types import Interval, MinLen
from pydantic import BaseModel, ConfigDict, Strict, StringConstraints

from hitenter.sampling_params import MAX_LOGPROBS

STRICT = Strict()
MAX_N = 128          # most completions one request may ask for (n x prompts)
TOKEN_ID_LIMIT = 2**31               # the served schema states the vocabulary instead (api._schema_for_served)

Int = Annotated[int, STRICT]
Float = Annotated[float, STRICT]
Bool = Annotated[bool, Strict()]      # true/false only, not 0/1 or "yes"
TokenId = Annotated[int, Interval(ge=0, lt=TOKEN_ID_LIMIT), STRICT]
Count = Annotated[int, Interval(ge=1, le=MAX_N), STRICT]
PositiveInt = Annotated[int, Interval(ge=1), STRICT]
NonNegInt = Annotated[int, Interval(ge=0), STRICT]
TopK = Annotated[int, Interval(ge=-1), STRICT]
Seed = Annotated[int, Interval(ge=-(2**53), le=2**53), STRICT]    # integers JSON carries exactly
NLogprobs = Annotated[int, Interval(ge=0, le=MAX_LOGPROBS), STRICT]
PromptLogprobs = Annotated[int, Interval(ge=0, le=20), STRICT]
Temperature = Annotated[float, Interval(ge=0, le=2), STRICT]
TopP = Annotated[float, Interval(gt=0, le=1), STRICT]
Fraction = Annotated[float, Interval(ge=0, le=1), STRICT]
Penalty = Annotated[float, Interval(ge=-2, le=2), STRICT]
PositiveFloat = Annotated[float, Interval(gt=0), STRICT]
Bias = Annotated[float, Interval(ge=-100, le=100), STRICT]
TokenKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,10}$")]
NonEmpty = Annotated[str, MinLen(1)]


class Lenient(BaseModel):
    """A top-level body that keeps unknown fields in ``model_extra`` (check_known_fields refuses them by name)."""
    model_config = ConfigDict(extra="allow")


class Nested(BaseModel):
    """An object inside a request body (or a body of a newer surface): an unknown key is a 400 naming it."""
    model_config = ConfigDict(extra="forbid")
