"""Assertions shared by the tokenizer tests: a Tokenizer against llama.cpp's golden facts for the same GGUF
(tests/goldens/*tokenizer*.json, written by scripts/make_*goldens.py)."""

from __future__ import annotations

import hashlib
from typing import Any

from hitenter.tokenizer import Tokenizer


def assert_vocab_facts(tok: Tokenizer, golden: dict[str, Any]) -> None:
    """Vocab size, BOS / EOS / add_bos, end-of-generation ids and special tokens as llama.cpp reports them."""
    assert tok.vocab_size == golden["n_vocab"]
    eos = -1 if tok.eos_token_id is None else tok.eos_token_id     # llama.cpp's LLAMA_TOKEN_NULL: none
    assert (tok.bos_token_id, eos, tok.add_bos) == (golden["bos"], golden["eos"], golden["add_bos"])
    assert tok.eog_token_ids == frozenset(golden["eog"])
    assert [i for i in range(tok.vocab_size) if tok.is_special(i)] == golden["special"]


def assert_token_bytes(tok: Tokenizer, golden: dict[str, Any]) -> None:
    """Every token's bytes: the first ones literally, all of them by a length-prefixed sha256. Tokens the
    golden lists in `unk_byte_ids` (llama.cpp prints "[UNK_BYTE_0x<hex><token text>]" for a byte-level
    piece with a character outside GPT-2's table) are left out of the hash: they are the token text's
    UTF-8 here, as HF's ByteLevel decoder falls back to."""
    unk = set(golden.get("unk_byte_ids", ()))
    head = range(len(golden["token_bytes_head"]))
    assert [tok.token_bytes(i).hex() for i in head if i not in unk] == [
        h for i, h in zip(head, golden["token_bytes_head"], strict=True) if i not in unk]
    h = hashlib.sha256()
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        if i in unk:
            assert b == tok.id_to_piece(i).encode("utf-8")
        else:
            h.update(len(b).to_bytes(4, "little") + b)
    assert h.hexdigest() == golden["token_bytes_sha256_known" if unk else "token_bytes_sha256"]


def assert_llamacpp_entries(tok: Tokenizer, golden: dict[str, Any]) -> None:
    """Every golden entry (scripts/make_llamacpp_vocab_goldens.py) as llama.cpp gives it: ids with
    parse_special false / true (no BOS), and both id lists decoded as llama_detokenize does with
    (remove_special, unparse_special) = (false, true) and (true, false)."""
    bad = []
    for e in golden["entries"]:
        got = {"ids": tok.encode(e["text"], add_bos=False, parse_special=False),
               "ids_special": tok.encode(e["text"], add_bos=False)}
        for key in ("ids", "ids_special"):
            got[f"{key}_detok"] = tok.decode(e[key])
            got[f"{key}_detok_skip"] = tok.decode(e[key], skip_special_tokens=True)
        bad += [(e["text"], k, v, e[k]) for k, v in got.items() if v != e[k]]
    assert not bad, "\n".join(f"{t!r} {k}: ours {a!r} llama.cpp {b!r}" for t, k, a, b in bad[:20])
