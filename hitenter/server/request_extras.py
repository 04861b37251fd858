"""Request fields beyond the sampling basics, and the rule that nothing sent is silently ignored.

- :class:`GuidedFields` (completions + chat): ``response_format`` (OpenAI: ``text``, ``json_object``,
  ``json_schema``) and vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``
  / ``structured_outputs`` -> one :class:`GuidedSpec` (at most one of them may be given).
- :class:`ChatExtras`: tools, tool_choice, parallel_tool_calls, continue_final_message, echo,
  prompt_logprobs.
- :func:`check_known_fields`: a field we do not know is a 400 naming it (as OpenAI does), never
  accepted-and-ignored; ``stream_options`` without ``stream`` is a 400 (as vLLM does).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from annotated_types import Interval, MinLen
from pydantic import BaseModel, BeforeValidator, ConfigDict, Strict

from hitenter.engine.structured import GuidedSpec


def APIError(status: int, message: str, param: str | None = None) -> Exception:  # noqa: N802
    """protocol.APIError, imported late (protocol imports this module's request mixins)."""
    from hitenter.server.protocol import APIError as E

    return E(status, message, param)


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("must be a number, not a boolean")
    return v


Bool = Annotated[bool, Strict()]      # true/false only, as the schema says (not 0/1)
PromptLogprobs = Annotated[int, Interval(ge=0, le=20), Strict(), BeforeValidator(_no_bool)]

# Sent by clients as pure metadata (no effect on generation, documented as such)
METADATA_FIELDS = frozenset({"user"})


class GuidedFields(BaseModel):
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[Annotated[str, MinLen(1)]], MinLen(1)] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None    # vLLM >= 0.10: {json | regex | choice | grammar}
    prompt_logprobs: PromptLogprobs | None = None

    def guided_spec(self) -> GuidedSpec | None:
        found = [(name, spec) for name, spec in (
            ("response_format", _response_format(self.response_format)),
            ("guided_json", _schema_spec(self.guided_json, "guided_json")),
            ("guided_regex", None if self.guided_regex is None else GuidedSpec("regex", self.guided_regex,
                                                                                "guided_regex")),
            ("guided_choice", _choice_spec(self.guided_choice, "guided_choice")),
            ("guided_grammar", None if self.guided_grammar is None else GuidedSpec("grammar", self.guided_grammar,
                                                                                    "guided_grammar")),
            ("structured_outputs", _structured_outputs(self.structured_outputs)),
        ) if spec is not None]
        if len(found) > 1:
            names = ", ".join(n for n, _ in found)
            raise APIError(400, f"{found[1][0]}: give one structured output constraint, got {names}", found[1][0])
        return found[0][1] if found else None


def _schema_spec(schema: Any, param: str) -> GuidedSpec | None:
    if schema is None:
        return None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise APIError(400, f"{param}: not valid JSON: {e}", param) from e
    if not isinstance(schema, dict):
        raise APIError(400, f"{param}: must be a JSON schema object", param)
    return GuidedSpec("json_schema", json.dumps(schema), param)


def _choice_spec(choices: Any, param: str) -> GuidedSpec | None:
    if choices is None:
        return None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise APIError(400, f"{param}: must be a non-empty list of non-empty strings", param)
    return GuidedSpec("choice", json.dumps(choices), param)


_RF_KEYS = {"text": {"type"}, "json_object": {"type", "schema"}, "json_schema": {"type", "json_schema"}}
_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


def _unknown_keys(obj: dict[str, Any], known: set[str], param: str) -> None:
    extra = sorted(set(obj) - known)
    if extra:
        raise APIError(400, f"{param}: unsupported key(s) {extra}; known: {sorted(known)}", param)


def _response_format(rf: dict[str, Any] | None) -> GuidedSpec | None:
    """OpenAI's ``response_format``; ``json_object`` may carry a ``schema`` (llama.cpp's extension),
    which then constrains the output like ``json_schema`` does. Any other key is a 400."""
    if rf is None:
        return None
    kind = rf.get("type")
    if kind not in _RF_KEYS:
        raise APIError(400, f"response_format: type must be text, json_object or json_schema, got {kind!r}",
                       "response_format")
    _unknown_keys(rf, _RF_KEYS[kind], "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        if rf.get("schema") is not None:
            return _schema_spec(rf["schema"], "response_format")
        return GuidedSpec("json", "", "response_format")
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
        raise APIError(400, "response_format: json_schema must be {name, schema, strict?}", "response_format")
    _unknown_keys(js, _JSON_SCHEMA_KEYS, "response_format.json_schema")
    return _schema_spec(js.get("schema") or {"type": "object"}, "response_format")


def _structured_outputs(so: dict[str, Any] | None) -> GuidedSpec | None:
    if so is None:
        return None
    keys = [k for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) is not None]
    unknown = sorted(set(so) - {"json", "regex", "choice", "grammar", "json_object"})
    if unknown or len(keys) != 1:
        raise APIError(400, "structured_outputs: give exactly one of json, regex, choice, grammar, json_object"
                       + (f" (unsupported: {unknown})" if unknown else ""), "structured_outputs")
    k, v = keys[0], so[keys[0]]
    if k == "json":
        return _schema_spec(v, "structured_outputs")
    if k == "json_object":
        return GuidedSpec("json", "", "structured_outputs") if v else None
    if k == "choice":
        return _choice_spec(v, "structured_outputs")
    if not isinstance(v, str):
        raise APIError(400, f"structured_outputs: {k} must be a string", "structured_outputs")
    return GuidedSpec("regex" if k == "regex" else "grammar", v, "structured_outputs")


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str = "function"
    function: ToolFunction


class ChatExtras(BaseModel):
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: Bool | None = None
    continue_final_message: Bool = False
    echo: Bool = False


def check_known_fields(req: BaseModel) -> None:
    """400 for fields the request model does not define (``extra="allow"`` keeps them in model_extra)."""
    extra = sorted(set(req.model_extra or {}) - METADATA_FIELDS)
    if extra:
        raise APIError(400, f"{extra[0]}: unsupported request field(s) {extra}; see the README for the fields "
                       "this server implements", extra[0])
    if getattr(req, "stream_options", None) is not None and not getattr(req, "stream", False):
        raise APIError(400, "stream_options: only allowed when stream is true", "stream_options")
    pl = getattr(req, "prompt_logprobs", None)
    if pl is not None and (isinstance(pl, bool) or not 0 <= pl <= 20):
        raise APIError(400, f"prompt_logprobs: must be an integer in [0, 20] or null, got {pl!r}", "prompt_logprobs")
