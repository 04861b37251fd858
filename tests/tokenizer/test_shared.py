"""tokenizer/shared.py: engines on one unchanged GGUF share one tokenizer while it is held; a changed file,
another file or a tokenizer no longer held builds a new one."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

from hitenter.models.gguf import open_gguf, read_gguf_metadata
from hitenter.testing.tiny_model import write_tiny_gguf
from hitenter.tokenizer.shared import shared_tokenizer


def test_one_file_one_tokenizer_while_held(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    other = write_tiny_gguf(tmp_path / "o.gguf", "llama")
    first = shared_tokenizer(path)
    assert shared_tokenizer(path) is first
    assert shared_tokenizer(str(path), read_gguf_metadata(open_gguf(path))) is first   # metadata not re-read
    assert shared_tokenizer(other) is not first
    assert shared_tokenizer(other).encode("hello world") == shared_tokenizer(other).encode("hello world")
    held = weakref.ref(first)
    del first
    gc.collect()
    assert held() is None   # the cache does not keep a tokenizer alive (an unloaded model's vocabulary goes)
    assert shared_tokenizer(path).encode("hello world")   # built anew


def test_a_changed_file_gets_its_own(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    before = shared_tokenizer(path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    after = shared_tokenizer(path)
    assert after is not before and after.vocab_size == before.vocab_size
