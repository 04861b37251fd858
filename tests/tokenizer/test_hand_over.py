"""gguf_meta.hand_over: the loader's parsed header taken by the tokenizer's next read of the same, unchanged
file (one parse per load); any other file, a changed file or a second read parses the header itself."""

from __future__ import annotations

import os
from pathlib import Path

from hitenter.models.gguf import open_gguf, read_gguf_metadata
from hitenter.tokenizer import gguf_meta
from hitenter.tokenizer.bpe import Tokenizer
from hitenter.testing.tiny_model import write_tiny_gguf


def test_the_handed_header_is_taken_once_and_equals_a_parse(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    handed = read_gguf_metadata(open_gguf(path))
    gguf_meta.hand_over(path, handed)
    assert gguf_meta.read_tokenizer_metadata(path) is handed
    parsed = gguf_meta.read_tokenizer_metadata(path)   # taken: this one parses
    assert parsed is not handed and parsed == handed
    gguf_meta.hand_over(path, handed)
    assert Tokenizer.from_gguf(path).encode("hello world") == Tokenizer.from_gguf(path).encode("hello world")


def test_a_changed_or_other_file_is_parsed(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    other = write_tiny_gguf(tmp_path / "o.gguf", "llama")
    stale = {"tokenizer.ggml.model": "stale"}
    gguf_meta.hand_over(path, stale)
    assert gguf_meta.read_tokenizer_metadata(other)["general.architecture"] == "llama"
    assert gguf_meta.read_tokenizer_metadata(path) is not stale   # a read of another file dropped it
    gguf_meta.hand_over(path, stale)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert gguf_meta.read_tokenizer_metadata(path)["tokenizer.ggml.model"] == "gpt2"
