"""IncrementalDetokenizer: stop strings across tokens, streaming hold-back, UTF-8 split across tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hitenter.sampling_params import SamplingParams as SP
from hitenter.tokenizer.detokenizer import IncrementalDetokenizer

SPECIAL = b"<|eot|>"


class FakeTok:
    """Ids handed out on demand for byte chunks; SPECIAL is a special token."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = [SPECIAL]
        self.ids: dict[bytes, int] = {SPECIAL: 0}

    def id(self, piece: bytes) -> int:
        if piece not in self.ids:
            self.ids[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self.ids[piece]

    def token_bytes(self, tid: int) -> bytes:
        return self.pieces[tid]

    def is_special(self, tid: int) -> bool:
        return tid == 0


def stream(chunks: list[bytes | str], params: SP, flush: bool = True) -> tuple[list[str], str | None, str]:
    """Feed chunks as tokens; return (emitted deltas incl. flush, stop string, final text)."""
    tok = FakeTok()
    d = IncrementalDetokenizer(tok.token_bytes, tok.is_special, params)
    deltas, stop = [], None
    for c in chunks:
        out = d.add(tok.id(c.encode() if isinstance(c, str) else c))
        deltas.append(out.text)
        if out.stop_string is not None:
            stop = out.stop_string
            break
    if stop is None and flush:
        deltas.append(d.flush())
    assert "".join(deltas) == d.text
    return deltas, stop, d.text


def reference(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Char-by-char semantics: the first stop to complete wins (longest on a tie)."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            s = max(hits, key=len)
            return (text[:end] if include else text[:end - len(s)]), s
    return text, None


def test_stop_string_across_three_tokens_truncates_and_holds() -> None:
    deltas, stop, text = stream(["Hello", " world. E", "N", "D more"], SP(stop="END"))
    assert stop == "END" and text == "Hello world. "
    assert deltas == ["Hello", " world. ", "", ""]
    assert not any(ch in "".join(deltas) for ch in "END")


def test_include_stop_str_in_output() -> None:
    deltas, stop, text = stream(["a", "bS", "TO", "Pzz"], SP(stop=["STOP"], include_stop_str_in_output=True))
    assert stop == "STOP" and text == "abSTOP" and "".join(deltas) == "abSTOP"


def test_overlapping_stops_take_the_first_to_complete() -> None:
    for chunks in (["xabc"], ["x", "a", "b", "c"], ["xa", "bc"]):
        _, stop, text = stream(chunks, SP(stop=["bc", "ab"]))
        assert (stop, text) == ("ab", "x")
    for chunks in (["xbcab"], ["xb", "cab"]):
        _, stop, text = stream(chunks, SP(stop=["ab", "bc"]))
        assert (stop, text) == ("bc", "x")
    # "bc" completes before "abcd" does, whatever the split
    for chunks in (["xabcd"], ["xab", "cd"], ["x", "abcd"]):
        assert stream(chunks, SP(stop=["abcd", "bc"]))[1:] == ("bc", "xa")


def test_stop_in_prompt_or_across_the_prompt_boundary_does_not_count() -> None:
    # the prompt "... say END" / "... EN" is never fed; only output text is matched
    _, stop, text = stream(["D and", " more"], SP(stop="END"))
    assert stop is None and text == "D and more"


def test_holds_only_a_proper_prefix_of_a_stop() -> None:
    tok = FakeTok()
    d = IncrementalDetokenizer(tok.token_bytes, tok.is_special, SP(stop=["</answer>", "###"]))
    out = d.add(tok.id(b"x < y"))
    assert (out.text, out.held) == ("x < y", "")           # "y" is no prefix: nothing held
    out = d.add(tok.id(b" </an"))
    assert (out.text, out.held) == (" ", "</an")
    out = d.add(tok.id(b"t"))                              # "</ant" cannot become a stop any more
    assert (out.text, out.held) == ("</ant", "")
    out = d.add(tok.id(b"a#"))
    assert (out.text, out.held) == ("a", "#")             # not a fixed len-1 window: only the prefix
    out = d.add(tok.id(b"#"))
    assert (out.text, out.held) == ("", "##")
    assert d.flush() == "##" and d.text == "x < y </anta##"


def test_min_tokens_delays_stop_strings() -> None:
    _, stop, text = stream(["S", "T", "x", "ST", "y"], SP(stop="ST", min_tokens=2))
    assert stop == "ST" and text == "STx"
    _, stop, text = stream(["S", "T", "x"], SP(stop="ST", min_tokens=2))
    assert stop is None and text == "STx"


def test_skip_special_tokens() -> None:
    assert stream(["a", SPECIAL, "b"], SP())[2] == "ab"
    assert stream(["a", SPECIAL, "b"], SP(skip_special_tokens=False))[2] == "a<|eot|>b"


def test_flush_and_add_after_finish() -> None:
    tok = FakeTok()
    d = IncrementalDetokenizer(tok.token_bytes, tok.is_special, SP(stop="zz"))
    assert d.add(tok.id(b"az")).text == "a"
    assert d.flush() == "z" and d.flush() == ""
    assert d.add(tok.id(b"more")).text == "" and d.text == "az"


MULTI = "héllo 👋🏽 世界 नमस्ते ∑ 😀!"


def test_byte_level_tokens_never_emit_partial_utf8() -> None:
    data = MULTI.encode()
    deltas, stop, text = stream([bytes([b]) for b in data], SP())
    assert stop is None and text == MULTI and "\ufffd" not in "".join(deltas)
    assert all(not (0xDC80 <= ord(c) <= 0xDCFF) for c in text)


def test_invalid_bytes_become_one_replacement_char() -> None:
    _, _, text = stream([b"a\xe4\xb8", b"b"], SP())             # truncated CJK then ASCII
    assert text == "a\ufffdb"
    _, _, text = stream([b"\xff", b"ok"], SP())
    assert text == "\ufffdok"
    deltas, _, text = stream([b"x\xf0\x9f"], SP())              # incomplete tail: dropped at flush
    assert deltas == ["x", ""] and text == "x"


def _random_split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, min(len(data) - 1, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def test_random_splits_with_stops_match_reference() -> None:
    rng = random.Random(0)
    alphabet = ["a", "b", "c", "é", "世", "👋", " ", "न", "्"]
    for _ in range(600):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        stops = ["".join(rng.choice(alphabet[:6]) for _ in range(rng.randint(1, 3))) for _ in range(2)]
        include = rng.random() < 0.3
        params = SP(stop=stops, include_stop_str_in_output=include)
        deltas, stop, got = stream(_random_split(text.encode(), rng), params)
        want, want_stop = reference(text, stops, include)
        assert (got, stop) == (want, want_stop), (text, stops)
        assert all("\ufffd" not in c for c in deltas)


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(text=st.text(alphabet=st.sampled_from(list("ab c") + ["é", "世", "👋", "न", "्", "🏽"]),
                               min_size=1, max_size=40),
                  stops=st.lists(st.text(alphabet=st.sampled_from(list("ab") + ["世", "👋"]), min_size=1,
                                         max_size=3), max_size=3),
                  include=st.booleans(), seed=st.integers(0, 2**32))
def test_property_streaming_equals_reference(text: str, stops: list[str], include: bool, seed: int) -> None:
    rng = random.Random(seed)
    chunks = _random_split(text.encode(), rng) if len(text.encode()) > 1 else [text.encode()]
    deltas, stop, got = stream(chunks, SP(stop=stops or None, include_stop_str_in_output=include))
    want, want_stop = reference(text, stops, include)
    assert (got, stop) == (want, want_stop)
    assert "".join(deltas) == got and all("\ufffd" not in c for c in deltas)


MODEL = Path.home() / ".cache" / "hitenter" / "models" / "smollm2-135m-instruct.gguf"


@pytest.mark.skipif(not MODEL.exists(), reason="SmolLM2 GGUF not in the cache")
def test_real_tokenizer_token_bytes_round_trip(gguf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = gguf_tokenizer(MODEL)
    text = "Emoji 👋🏽🎉, CJK 世界你好, Hindi नमस्ते दुनिया, math ∑∫, done."
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok.token_bytes, tok.is_special, SP(stop=["दुनिया"]))
    deltas = [d.add(t) for t in ids]
    stop_at = next(i for i, x in enumerate(deltas) if x.stop_string is not None)
    assert deltas[stop_at].stop_string == "दुनिया"
    assert "".join(x.text for x in deltas) == text[:text.index("दुनिया")] == d.text
    assert all("\ufffd" not in x.text for x in deltas)
    d = IncrementalDetokenizer(tok.token_bytes, tok.is_special, SP())
    chunks = [d.add(t).text for t in ids] + [d.flush()]
    assert "".join(chunks) == text and all("\ufffd" not in c for c in chunks)
