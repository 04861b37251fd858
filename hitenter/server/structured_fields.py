"""Structured outputs, from whichever spelling a surface uses, to one ``StructuredSpec`` for the engine
(hitenter/engine/structured.py: an xgrammar token mask in the sampler).

- a JSON schema (dict, or a JSON string of one): ``schema_spec``; any JSON: ``json_spec``;
- a choice of strings: ``choice_spec``; a regex or an EBNF grammar: ``StructuredSpec`` directly;
- OpenAI's ``response_format`` (``text`` / ``json_object`` (+ llama.cpp's ``schema``) / ``json_schema``)
  and vLLM's ``structured_outputs``: ``response_format_spec``, ``structured_outputs_spec``.
Every unknown key is a 400 naming it (``param``).
"""

from __future__ import annotations

import json
from typing import Any

from hitenter.sampling_params import StructuredSpec
from hitenter.server import field_limits as limits
from hitenter.server.api_error import APIError

_RF_KEYS = {"text": {"type"}, "json_object": {"type", "schema"}, "json_schema": {"type", "json_schema"}}
_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
_SO_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def unknown_keys(obj: dict[str, Any], known: set[str], param: str) -> None:
    """400 naming ``param`` when ``obj`` has a key outside ``known``."""
    extra = sorted(set(obj) - known)
    if extra:
        raise APIError(400, f"{param}: unsupported key(s) {extra}; known: {sorted(known)}", param)


def json_spec(param: str) -> StructuredSpec:
    """Any JSON object."""
    return StructuredSpec("json", "", param)


def schema_spec(schema: Any, param: str) -> StructuredSpec | None:
    """A JSON schema (a dict, or a string holding one); None passes."""
    if schema is None:
        return None
    if isinstance(schema, str):
        schema = limits.loads(schema, param)
    if not isinstance(schema, dict):
        raise APIError(400, f"{param}: must be a JSON schema object", param)
    limits.check_schema(schema, param)
    return StructuredSpec("json_schema", json.dumps(schema), param)


def choice_spec(choices: Any, param: str) -> StructuredSpec | None:
    if choices is None:
        return None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise APIError(400, f"{param}: must be a non-empty list of non-empty strings", param)
    limits.check_choices(choices, param)
    return StructuredSpec("choice", json.dumps(choices), param)


def response_format_spec(rf: dict[str, Any] | None, param: str = "response_format") -> StructuredSpec | None:
    """OpenAI's ``response_format``; ``json_object`` may carry a ``schema`` (llama.cpp's extension),
    which then constrains the output like ``json_schema`` does."""
    if rf is None:
        return None
    kind = rf.get("type")
    if kind not in _RF_KEYS:
        raise APIError(400, f"{param}: type must be text, json_object or json_schema, got {kind!r}", param)
    unknown_keys(rf, _RF_KEYS[kind], param)
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_spec(rf["schema"], param) if rf.get("schema") is not None else json_spec(param)
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
        raise APIError(400, f"{param}: json_schema must be {{name, schema, strict?}}", param)
    unknown_keys(js, _JSON_SCHEMA_KEYS, f"{param}.json_schema")
    return schema_spec(js.get("schema") or {"type": "object"}, param)


def structured_outputs_spec(so: dict[str, Any] | None, param: str = "structured_outputs") -> StructuredSpec | None:
    """vLLM >= 0.10's ``structured_outputs``: exactly one of json, regex, choice, grammar, json_object."""
    if so is None:
        return None
    keys = [k for k in _SO_KEYS if so.get(k) is not None]
    unknown = sorted(set(so) - set(_SO_KEYS))
    if unknown or len(keys) != 1:
        raise APIError(400, f"{param}: give exactly one of {', '.join(_SO_KEYS)}"
                       + (f" (unsupported: {unknown})" if unknown else ""), param)
    k, v = keys[0], so[keys[0]]
    if k == "json":
        return schema_spec(v, param)
    if k == "json_object":
        return json_spec(param) if v else None
    if k == "choice":
        return choice_spec(v, param)
    if not isinstance(v, str):
        raise APIError(400, f"{param}: {k} must be a string", param)
    return text_spec("regex" if k == "regex" else "grammar", v, param)


def text_spec(kind: str, text: str | None, param: str) -> StructuredSpec | None:
    """A regex or an EBNF grammar, within its length limit; None passes."""
    if text is None:
        return None
    limits.check_text(text, kind, param)
    return StructuredSpec(kind, text, param)


def one_of(found: list[tuple[str, StructuredSpec | None]]) -> StructuredSpec | None:
    """The one constraint given among ``(field, spec)``s; 400 when more than one is."""
    given = [(name, spec) for name, spec in found if spec is not None]
    if len(given) > 1:
        names = ", ".join(n for n, _ in given)
        raise APIError(400, f"{given[1][0]}: give one structured output constraint, got {names}", given[1][0])
    return given[0][1] if given else None
