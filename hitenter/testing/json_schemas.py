"""Random JSON schemas (nested objects, arrays, enums, required fields) with bounded sizes, so a
grammar-constrained generation always ends (strings <= 8 chars, arrays <= 3 items, bounded ints)."""

from __future__ import annotations

import random
from typing import Any

ASCII = False    # True: strings by pattern [a-z ]{0,8} (a random-weights model emits invalid UTF-8 otherwise)


def _leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["string", "integer", "boolean", "enum", "number_enum"])
    if kind == "string":
        n = rng.randint(1, 8)
        return {"type": "string", "pattern": f"^[a-z ]{{0,{n}}}$"} if ASCII else {"type": "string", "maxLength": n}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "cyan", "x"], rng.randint(1, 4))}
    if kind == "number_enum":
        return {"enum": rng.sample([1, 2, 3, 10, 42], rng.randint(1, 3))}
    return {"type": "boolean"}


def _node(rng: random.Random, depth: int) -> dict[str, Any]:
    r = rng.random()
    if depth > 0 and r < 0.3:
        return random_object(rng, depth - 1)
    if depth > 0 and r < 0.5:
        return {"type": "array", "items": _node(rng, depth - 1), "minItems": rng.randint(0, 1), "maxItems": 3}
    return _leaf(rng)


def random_object(rng: random.Random, depth: int = 2) -> dict[str, Any]:
    names = rng.sample(["id", "name", "tags", "meta", "size", "kind", "items", "ok"], rng.randint(1, 4))
    props = {n: _node(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def random_schemas(n: int, seed: int = 0, depth: int = 2, ascii_strings: bool = False) -> list[dict[str, Any]]:
    global ASCII
    ASCII = ascii_strings
    rng = random.Random(seed)
    return [random_object(rng, depth) for _ in range(n)]
