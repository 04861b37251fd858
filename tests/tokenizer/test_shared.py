"""tokenizer/shared.py: engines on one unchanged GGUF share one vocabulary while one of their tokenizers
is held, each with its own object (an attribute set on one stays with it); a changed file, another file or
a vocabulary no longer held builds a new one."""

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
    second = shared_tokenizer(str(path), read_gguf_metadata(open_gguf(path)))
    assert second is not first and second._hf is first._hf and second._tokens is first._tokens   # one vocabulary
    assert shared_tokenizer(other)._hf is not first._hf
    assert shared_tokenizer(other).encode("hello world") == shared_tokenizer(other).encode("hello world")
    held = weakref.ref(first.shared_vocabulary)
    del first, second
    gc.collect()
    assert held() is None   # the cache does not keep a tokenizer alive (an unloaded model's vocabulary goes)
    assert shared_tokenizer(path).encode("hello world")   # built anew


def test_a_changed_file_gets_its_own(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    before = shared_tokenizer(path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    after = shared_tokenizer(path)
    assert after._hf is not before._hf and after.vocab_size == before.vocab_size


def test_an_attribute_set_on_one_stays_with_it(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2")
    one = shared_tokenizer(path)
    template = one.chat_template
    one.chat_template = (template or "") + "{{ tools }}"   # an engine's own template (the server tests do this)
    assert shared_tokenizer(path).chat_template == template
