"""The types of the tokenizer's GGUF keys, checked before any of them is used.

A GGUF's metadata is typed by its writer, not by the reader: a hostile or broken file can store a string
where a token id belongs or an integer where the token list does. `check_tokenizer_types(md)` raises a
one-line ModelLoadError naming the first key whose value is not of the type the tokenizer reads
(hitenter/tokenizer/bpe.py, spm.py, vocab_attrs.py), and when the per-token arrays (types, scores)
differ in length from the token list. Keys the tokenizer does not read are not looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hitenter.errors import ModelLoadError

_P = "tokenizer.ggml."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _list_of(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    # each distinct element type checked once (a 150k-entry vocabulary holds one or two)
    return lambda v: isinstance(v, list) and all(item(x) for x in {type(x): x for x in v}.values())


_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "int": ("an integer", _is_int),
    "bool": ("a boolean", lambda v: isinstance(v, bool | int)),
    "list[str]": ("an array of strings", _list_of(lambda x: isinstance(x, str))),
    "list[int]": ("an array of integers", _list_of(_is_int)),
    "list[number]": ("an array of numbers", _list_of(_is_number)),
}
_EXACT: dict[str, str] = {
    _P + "model": "str", _P + "pre": "str", _P + "tokens": "list[str]", _P + "merges": "list[str]",
    _P + "token_type": "list[int]", _P + "scores": "list[number]", "tokenizer.chat_template": "str",
    "general.name": "str",
}


def _kind(key: str) -> str | None:
    if key in _EXACT:
        return _EXACT[key]
    if not key.startswith(_P):
        return None
    if key.endswith("_token_id"):
        return "int"
    if key.startswith(_P + "add_") or key.endswith("clean_spaces"):
        return "bool"
    return None


def _shown(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def check_tokenizer_types(md: Mapping[str, Any]) -> None:
    """ModelLoadError naming the first tokenizer key of the wrong type, or a per-token array whose
    length is not the token list's."""
    for key, value in md.items():
        kind = _kind(key)
        if kind is None or value is None:
            continue
        what, ok = _KINDS[kind]
        if not ok(value):
            raise ModelLoadError(f"GGUF metadata key {key!r} must be {what}, got {type(value).__name__} "
                                 f"{_shown(value)}: the file is corrupt")
    n = len(md.get(_P + "tokens") or ())
    for key in (_P + "token_type", _P + "scores"):
        if md.get(key) is not None and len(md[key]) != n:
            raise ModelLoadError(f"GGUF metadata key {key!r} has {len(md[key])} entries for {n} tokens")
