"""A hostile GGUF is a one-line ModelLoadError, never another exception, a hang or a huge allocation.

Each structural check of the header (hitenter/models/gguf_checks.py, the readers in models/gguf.py and
tokenizer/gguf_meta.py, the families' and tokenizer's type checks) is exercised on a damaged copy of a tiny
GGUF; then a seeded fuzzer (hitenter/testing/gguf_fuzz.py) loads mutated files as serving does, each under
a time guard. scripts/fuzz_gguf.py runs the same fuzzer longer.
"""

from __future__ import annotations

import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from hitenter.errors import ModelLoadError
from hitenter.models.gguf import open_gguf, read_gguf_metadata
from hitenter.models.loader import load_model
from hitenter.testing import gguf_fuzz
from hitenter.testing.gguf_fuzz import encode_value, layout, load_variant, mutants, replace_value
from hitenter.testing.tiny_model import write_tiny_gguf
from hitenter.tokenizer import template_limits
from hitenter.tokenizer.bpe import Tokenizer
from hitenter.tokenizer.gguf_meta import read_tokenizer_metadata

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A tiny Llama with Q8_0 projections and the tiny BPE vocabulary (~100 KB)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("hostile") / "base.gguf", quant="Q8_0").read_bytes()


@pytest.fixture
def write(tmp_path: Path) -> Iterator[object]:
    n = iter(range(1 << 20))

    def _write(data: bytes) -> Path:
        p = tmp_path / f"v{next(n)}.gguf"
        p.write_bytes(data)
        return p

    yield _write


def refused(path: Path, match: str, readers: tuple[str, ...] = ("model", "tokenizer")) -> None:
    """Every reader named refuses `path` with a one-line ModelLoadError matching `match`, within 1 s."""
    calls = {"model": lambda: load_model(path), "tokenizer": lambda: read_tokenizer_metadata(path),
             "open": lambda: open_gguf(path), "vocab": lambda: Tokenizer.from_gguf(path)}
    for r in readers:
        t0 = time.monotonic()
        with pytest.raises(ModelLoadError, match=match) as ei:
            calls[r]()
        assert "\n" not in str(ei.value), (r, str(ei.value))
        assert time.monotonic() - t0 < 1.0, (r, time.monotonic() - t0)


def _put(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


def _tensor(lay: gguf_fuzz.Layout, i: int, kind: str) -> gguf_fuzz.Field:
    return next(f for f in lay.tensor_fields[i] if f.kind == kind)


# ---- counts and lengths against the file's size -----------------------------------------------------

@pytest.mark.parametrize("offset, what", [(8, "tensors"), (16, "metadata key/values")])
def test_a_header_claiming_2_60_items_fails_at_once(base: bytes, write, offset: int, what: str) -> None:
    p = write(_put(base, offset, "<Q", 1 << 60))
    refused(p, f"claims {1 << 60} {what}" if what == "tensors" else "claims",
            ("model",) if what == "tensors" else ("model", "tokenizer"))


def test_a_2_40_entry_array_or_string_fails_at_once(base: bytes, write) -> None:
    lay = layout(base)
    tokens = next(k for k in lay.kvs if k.key == "tokenizer.ggml.tokens")
    count = tokens.value_start + 4 + 4         # value type, element type, then the count
    refused(write(_put(base, count, "<Q", 1 << 40)), "1099511627776 STRING array entries|claims 1099511627776")
    name = next(k for k in lay.kvs if k.key == "general.name")
    refused(write(_put(base, name.value_start + 4, "<Q", 1 << 40)), "runs past the end of the file")


def test_every_structural_truncation_is_refused(base: bytes, write) -> None:
    lay = layout(base)
    cuts = sorted({f.offset for f in lay.fields if f.kind not in ("text", "scalar")}
                  | {f.offset + 1 for f in lay.fields if f.size > 1 and f.kind != "text"}
                  | {lay.data_start, lay.data_start + 1})
    cuts = sorted({*cuts[::3], *(f.offset for f in lay.fields if f.kind in ("count", "vtype", "itype", "dim"))})
    t0 = time.monotonic()
    for i, cut in enumerate(cuts):
        p = write(base[:cut])
        with pytest.raises(ModelLoadError, match="truncated or corrupt|not a GGUF"):
            open_gguf(p)
        if cut < lay.kvs[-1].end and i % 4 == 0:        # the tokenizer's reader stops after the key/values
            with pytest.raises(ModelLoadError, match="truncated or corrupt|not a GGUF"):
                read_tokenizer_metadata(p)
    assert len(cuts) > 100 and time.monotonic() - t0 < 20, len(cuts)


# ---- the tensor table ---------------------------------------------------------------------------------

def test_overlapping_tensors_are_refused(base: bytes, write) -> None:
    lay = layout(base)
    first = int.from_bytes(base[_tensor(lay, 0, "toffset").offset:][:8], "little")
    refused(write(_put(base, _tensor(lay, 3, "toffset").offset, "<Q", first)), "overlap", ("open",))


def test_misaligned_and_out_of_file_offsets_are_refused(base: bytes, write) -> None:
    lay = layout(base)
    f = _tensor(lay, 2, "toffset")
    old = int.from_bytes(base[f.offset:f.offset + 8], "little")
    refused(write(_put(base, f.offset, "<Q", old + 1)), "not a multiple of the file's alignment 32", ("open",))
    refused(write(_put(base, f.offset, "<Q", len(base))), "runs past the end of the file", ("open",))
    refused(write(_put(base, f.offset, "<Q", (1 << 64) - 32)), "runs past the end of the file", ("open",))


def test_unknown_types_and_wrong_block_sizes_are_refused(base: bytes, write) -> None:
    lay = layout(base)
    names = [bytes(base[g.offset:g.offset + g.size]).decode() for t in lay.tensor_fields for g in t[:2]
             if g.kind == "name"]
    q = names.index("blk.0.attn_q.weight")
    ttype = _tensor(lay, q, "ttype").offset
    for raw in (4, 42, 99, (1 << 32) - 1):                # removed Q4_2, past the last type, garbage
        refused(write(_put(base, ttype, "<I", raw)), f"unknown GGML type {raw}", ("open",))
    # the tensor's 64-element rows are not whole Q4_K (256) blocks; as F32 its data would run past its span
    refused(write(_put(base, ttype, "<I", int(Q.Q4_K))), "not a multiple of its block size 256", ("open",))
    refused(write(_put(base, ttype, "<I", int(Q.F32))), "overlap|runs past the end", ("open",))


def test_too_many_dims_and_overflowing_shapes_are_refused(base: bytes, write) -> None:
    lay = layout(base)
    refused(write(_put(base, _tensor(lay, 0, "ndims").offset, "<I", 5)), "5 dims, at most 4", ("open",))
    refused(write(_put(base, _tensor(lay, 0, "ndims").offset, "<I", 1 << 31)), "dims, at most 4", ("open",))
    dims = [g for g in lay.tensor_fields[0] if g.kind == "dim"]
    data = _put(_put(base, dims[0].offset, "<Q", 1 << 40), dims[1].offset, "<Q", 1 << 40)
    refused(write(data), "element count overflows", ("open",))


# ---- names, keys and their types ----------------------------------------------------------------------

def test_bad_utf8_and_control_characters_in_names_are_refused(base: bytes, write) -> None:
    lay = layout(base)
    key = next(f for f in lay.fields if f.kind == "name")
    refused(write(base[:key.offset] + b"\xff" + base[key.offset + 1:]), "not valid UTF-8", ("open", "tokenizer"))
    tname = lay.tensor_fields[0][1]
    refused(write(base[:tname.offset] + b"\n" + base[tname.offset + 1:]), "control characters", ("open",))


def test_bad_utf8_in_a_string_value_names_the_key(base: bytes, write) -> None:
    lay = layout(base)
    name = next(k for k in lay.kvs if k.key == "general.name")
    at = name.value_start + 4 + 8
    p = write(base[:at] + b"\xc0" + base[at + 1:])
    with pytest.raises(ModelLoadError, match="'general.name' is corrupt: UnicodeDecodeError"):
        read_gguf_metadata(p)
    assert read_tokenizer_metadata(p)["general.name"].startswith("\ufffd")   # as llama.cpp: not checked


def test_a_duplicate_key_is_refused(base: bytes, write) -> None:
    p = write(gguf_fuzz.duplicate_key(base, layout(base), "llama.block_count"))
    refused(p, "'llama.block_count' appears twice", ("open", "tokenizer"))


def test_a_nested_array_is_refused(base: bytes, write) -> None:
    nested = struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 4, 0)
    p = write(replace_value(base, layout(base), "general.name", nested))
    refused(p, "nested", ("open", "tokenizer"))


@pytest.mark.parametrize("key, value, match", [
    ("llama.block_count", "abc", r"'llama.block_count' has a value of the wrong type or range \('abc'\)"),
    ("llama.embedding_length", [1, 2], r"'llama.embedding_length' has a value of the wrong type"),
    ("llama.context_length", float("nan"), r"'llama.context_length' has a value of the wrong type"),
    ("llama.block_count", 1 << 40, r"'llama.block_count' is 1099511627776, outside 1..4096"),
    ("general.architecture", 7, r"'general.architecture' must be a string"),
    ("llama.vocab_size", 7, r"the vocabulary has \d+ tokens but the model 7"),
])
def test_metadata_of_the_wrong_type_names_the_key(base: bytes, write, key: str, value: object, match: str) -> None:
    refused(write(replace_value(base, layout(base), key, encode_value(value))), match, ("model",))


@pytest.mark.parametrize("key, value, match", [
    ("tokenizer.ggml.bos_token_id", "abc", "'tokenizer.ggml.bos_token_id' must be an integer, got str"),
    ("tokenizer.ggml.tokens", 5, "'tokenizer.ggml.tokens' must be an array of strings, got int"),
    ("tokenizer.ggml.merges", [1, 2], "'tokenizer.ggml.merges' must be an array of strings"),
    ("tokenizer.ggml.model", [], "'tokenizer.ggml.model' must be a string"),
    ("tokenizer.chat_template", 1 << 40, "'tokenizer.chat_template' must be a string"),
    ("tokenizer.ggml.token_type", [1, 1], "'tokenizer.ggml.token_type' has 2 entries for \\d+ tokens"),
])
def test_tokenizer_metadata_of_the_wrong_type_names_the_key(base: bytes, write, key: str, value: object,
                                                            match: str) -> None:
    refused(write(replace_value(base, layout(base), key, encode_value(value))), match, ("vocab",))


# ---- the fuzzer -------------------------------------------------------------------------------------

ALLOWED = ("loaded", "refused: ", "template refused: ")
CASE_SECONDS = 5.0


class _Slow(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Slow(f"a case ran past {CASE_SECONDS} s")


def fuzz(data: bytes, write, seed: int, n: int) -> dict[str, int]:
    """n seeded mutants of `data`, each loaded under a SIGALRM guard; returns outcome counts by kind."""
    rng = np.random.default_rng(seed)
    outcomes: dict[str, int] = {}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i, (kind, label, variant) in enumerate(mutants(data, rng, n)):
            p = write(variant)
            signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
            try:
                result = load_variant(p, dense=i % 3 == 0)
            except _Slow:
                pytest.fail(f"{kind} ({label}): took more than {CASE_SECONDS} s")
            except Exception as e:   # anything but a ModelLoadError / template ValueError is a defect
                pytest.fail(f"{kind} ({label}): {type(e).__name__}: {e}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            assert result.startswith(ALLOWED), result
            key = f"{kind}:{result.split(':')[0]}"
            outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        signal.signal(signal.SIGALRM, old)
    return outcomes


@pytest.fixture
def quick_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile templates stop at a smaller budget here (the limits themselves: tests/tokenizer)."""
    monkeypatch.setattr(template_limits, "MAX_STEPS", 100_000)
    monkeypatch.setattr(template_limits, "MAX_RENDER_SECONDS", 0.5)


def test_fuzz_mutated_headers(base: bytes, write, quick_templates: None) -> None:
    load_variant(write(base))   # imports and first-use builds before the clock starts
    t0 = time.monotonic()
    outcomes = fuzz(base, write, seed=44, n=60)
    refusals = sum(v for k, v in outcomes.items() if ":refused" in k)
    assert refusals >= 30, outcomes                        # the mutations do damage, and it is caught
    assert time.monotonic() - t0 < 30, outcomes


@pytest.mark.slow
@pytest.mark.parametrize("arch, quant", [("llama", "Q8_0"), ("qwen2", {"ffn_down": "Q4_K", "attn_v": "Q6_K"}),
                                         ("llama", "Q4_0")])
def test_fuzz_longer(tmp_path: Path, write, quick_templates: None, arch: str, quant: object) -> None:
    data = write_tiny_gguf(tmp_path / "b.gguf", arch=arch, quant=quant).read_bytes()
    load_variant(write(data))
    outcomes = fuzz(data, write, seed=1000 + len(arch), n=300)
    assert sum(outcomes.values()) == 300


def test_an_expert_tensor_of_a_type_the_loader_cannot_read_is_refused(tmp_path: Path, write) -> None:
    """A 3-D expert tensor stored as I8 (a type with no dequantizer) was a NotImplementedError."""
    from hitenter.testing.tiny_families import write_tiny_family

    data = write_tiny_family(tmp_path / "moe.gguf", "qwen3moe", quant="Q8_0").read_bytes()
    lay = layout(data)
    names = [bytes(data[t[1].offset:t[1].offset + t[1].size]).decode() for t in lay.tensor_fields]
    i = next(i for i, n in enumerate(names) if n.endswith("ffn_down_exps.weight"))
    refused(write(_put(data, _tensor(lay, i, "ttype").offset, "<I", int(Q.I8))), "unsupported GGML type I8",
            ("model",))
