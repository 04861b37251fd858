"""tokenizer/vocab_cache.py: a GGUF's tokenizer key/values kept on disk give the same token ids as the
header's; a copy that is corrupt, truncated, of another file or unbuildable is ignored and written again;
writers racing on one file leave one whole, valid file; models/gguf.py leaves a big string array undecoded
until it is read."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hitenter.models import gguf as gguf_mod
from hitenter.models.gguf import GGUFStrings, open_gguf, read_gguf_metadata
from hitenter.models.registry import resolve_model
from hitenter.testing.tiny_model import write_tiny_gguf
from hitenter.tokenizer import vocab_cache
from hitenter.tokenizer.bpe import Tokenizer
from hitenter.tokenizer.shared import _build
from hitenter.tokenizer.vocab_cache import load_vocab, store_vocab

TEXTS = ["hello world", "Hello, World! 123 4567", "  spaced\n\nlines\t tabs", "ünïcödé 日本語 🙂", ""]


@pytest.fixture
def gguf_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(vocab_cache, "MIN_TOKENS", 1)   # the tiny vocabulary is cached too
    return write_tiny_gguf(tmp_path / "m.gguf", "qwen2")


def _cache_file(path: Path) -> Path:
    (found,) = (vocab_cache.cache_dir()).glob(f"{path.stem}-*.vocab")
    return found


def _ids(tok: Tokenizer) -> list[list[int]]:
    return [tok.encode(t) for t in TEXTS]


def test_cached_tokenizer_gives_the_header_ids(gguf_path: Path) -> None:
    uncached = Tokenizer.from_gguf(gguf_path)
    assert load_vocab(gguf_path) is None
    first = _build(gguf_path, None)                    # builds from the header and writes the cache
    cached_md = load_vocab(gguf_path)
    assert cached_md is not None and cached_md["tokenizer.ggml.tokens"] == uncached._tokens
    second = _build(gguf_path, None)                   # from the cache
    assert _ids(first) == _ids(second) == _ids(uncached)
    assert second._types == uncached._types and second.eog_token_ids == uncached.eog_token_ids


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "other_file"])
def test_a_bad_cache_file_is_ignored_and_rebuilt(gguf_path: Path, damage: str) -> None:
    uncached = Tokenizer.from_gguf(gguf_path)
    _build(gguf_path, None)
    cache = _cache_file(gguf_path)
    data = cache.read_bytes()
    if damage == "flip":
        cache.write_bytes(data[:-10] + bytes([data[-10] ^ 0x01]) + data[-9:])
    elif damage == "truncate":
        cache.write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        cache.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        cache.write_bytes(b"")
    elif damage == "other_file":   # the GGUF changed since: its key no longer matches
        st = gguf_path.stat()
        os.utime(gguf_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_vocab(gguf_path) is None
    rebuilt = _build(gguf_path, None)
    assert _ids(rebuilt) == _ids(uncached)
    again = load_vocab(gguf_path)
    assert again is not None and again["tokenizer.ggml.tokens"] == uncached._tokens   # written anew


def test_unbuildable_values_with_a_valid_frame_fall_back_to_the_header(gguf_path: Path) -> None:
    uncached = Tokenizer.from_gguf(gguf_path)
    md = {k: v for k, v in read_gguf_metadata(open_gguf(gguf_path)).items() if k.startswith("tokenizer.")}
    store_vocab(gguf_path, {**md, "tokenizer.ggml.model": "no-such-model"})
    assert load_vocab(gguf_path) is not None          # reads, but does not build
    assert _ids(_build(gguf_path, None)) == _ids(uncached)
    cached = load_vocab(gguf_path)
    assert cached is not None and cached["tokenizer.ggml.model"] == md["tokenizer.ggml.model"]


def test_racing_writers_leave_one_valid_file(gguf_path: Path) -> None:
    md = read_gguf_metadata(open_gguf(gguf_path))
    uncached = Tokenizer.from_gguf(gguf_path)
    seen: list[object] = []
    stop = threading.Event()

    def write() -> None:
        for _ in range(20):
            store_vocab(gguf_path, md)

    def read() -> None:
        while not stop.is_set():
            got = load_vocab(gguf_path)
            seen.append(None if got is None else got["tokenizer.ggml.tokens"] == uncached._tokens)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write) for _ in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    assert False not in seen   # a reader saw no copy, or a whole one; never a partial or mixed one
    assert [p.name for p in vocab_cache.cache_dir().iterdir()] == [_cache_file(gguf_path).name]   # no temp left
    assert _ids(_build(gguf_path, None)) == _ids(uncached)


def test_files_of_removed_ggufs_go_at_the_next_write(gguf_path: Path, tmp_path: Path) -> None:
    gone = write_tiny_gguf(tmp_path / "gone.gguf", "qwen2")
    _build(gone, None)
    stale = _cache_file(gone)
    dead_tmp = vocab_cache.cache_dir() / f".{stale.name}.999999999.1.tmp"   # no such process
    dead_tmp.write_bytes(b"partial")
    gone.unlink()
    _build(gguf_path, None)
    assert not stale.exists() and not dead_tmp.exists() and _cache_file(gguf_path).exists()


def test_switched_off_writes_and_reads_nothing(gguf_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_WEIGHT_CACHE", "0")
    _build(gguf_path, None)
    assert not vocab_cache.cache_dir().exists() and load_vocab(gguf_path) is None


def test_big_string_arrays_are_decoded_when_read(gguf_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_mod, "LAZY_STRINGS_MIN", 1)
    reader = open_gguf(gguf_path)
    tokens = read_gguf_metadata(reader)["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GGUFStrings) and tokens._items is None   # not decoded yet
    expected = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == len(expected) and tokens._items is None      # its length needs no decoding
    assert tokens == expected and list(tokens) == expected and tokens[3] == expected[3]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"])
def test_real_vocabulary_cached_ids_match(model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = resolve_model(model)
    if not Path(path).exists():
        pytest.skip(f"{model} not downloaded")
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path))
    uncached = Tokenizer.from_gguf(path)
    _build(path, read_gguf_metadata(open_gguf(path)))
    assert load_vocab(path) is not None
    cached = _build(path, None)
    texts = [*TEXTS, "<|im_start|>user\nwrite a quicksort<|im_end|>\n", Path(__file__).read_text()]
    assert [cached.encode(t) for t in texts] == [uncached.encode(t) for t in texts]
    assert cached._tokens == uncached._tokens and cached._types == uncached._types
