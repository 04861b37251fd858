"""The server's modules by role, and the direction their imports may take (read by ast from every import,
at any level, as tests/test_layers.py reads the package's): lower roles never import higher ones.

- foundation: api_error.py (the error model and its handlers), schema_types.py, field_limits.py,
  body_limits.py (the bounds on every body)
- protocol: protocol_*.py (an API's typed request bodies), structured_fields.py (their structured-output
  fields as specs) and the parsers of a reply (reasoning/, tool_parsers/), which know no route and no engine
- framing: middleware.py (around every route), auth.py (--api-key)
- logic: chat_format.py, reply.py, generation.py and the rest of the server's shared modules
- surfaces: serving_*.py (an API's logic and routes), api.py (the app), playground*.py

A request's path is not counted in files any more: what stays small is each file's role and what it may
see, checked here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hitenter.testing.paths import PACKAGE

SERVER = PACKAGE / "server"
ORDER = ("foundation", "protocol", "framing", "logic", "surfaces")


def role(module: str) -> str:
    """The role of a ``hitenter.server`` module (dotted, without the prefix)."""
    top, _, _ = module.partition(".")
    if top in ("api_error", "schema_types", "field_limits", "body_limits"):
        return "foundation"
    if top.startswith("protocol_") or top in ("structured_fields", "reasoning", "tool_parsers"):
        return "protocol"
    if top in ("middleware", "auth"):
        return "framing"
    if top.startswith(("serving_", "playground")) or top == "api":
        return "surfaces"
    return "logic"


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SERVER.rglob("*.py")):
        parts = list(path.relative_to(SERVER).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            out[".".join(parts)] = path
    return out


def server_imports(path: Path) -> set[str]:
    """The hitenter.server modules ``path`` imports, anywhere in the file (without the prefix)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.module != "hitenter.server" else [f"hitenter.server.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n.removeprefix("hitenter.server.") for n in names if n.startswith("hitenter.server.")}
    return out


MODULES = modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name: str) -> None:
    mine = ORDER.index(role(name))
    up = sorted(m for m in server_imports(MODULES[name]) if ORDER.index(role(m)) > mine)
    assert not up, f"{name} ({role(name)}) imports higher roles: {[(m, role(m)) for m in up]}"


def test_every_surface_has_its_protocol() -> None:
    """The surfaces split by role so far: their request bodies live in their protocol module."""
    for serving, protocol in (("serving_messages", "protocol_anthropic"), ("serving_responses", "protocol_responses"),
                              ("serving_chat", "protocol_openai"), ("serving_completion", "protocol_openai")):
        assert protocol in server_imports(MODULES[serving])
        text = MODULES[serving].read_text()
        assert not any(f"class {c}Request" in text for c in ("Messages", "Responses", "ChatCompletion", "Sampling"))


def test_roles_are_known() -> None:
    assert role("protocol_anthropic") == "protocol" and role("reasoning.tags") == "protocol"
    assert role("middleware") == "framing" and role("serving_chat") == "surfaces" and role("reply") == "logic"
