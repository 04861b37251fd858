"""SamplingParams validation: every invalid field is rejected with a message naming it."""

from __future__ import annotations

import dataclasses

import pytest

from hitenter.sampling_params import SamplingParams

INVALID = [
    ("n", 0), ("n", -1), ("n", 1.5), ("n", True),
    ("temperature", -0.1), ("temperature", 2.01), ("temperature", float("nan")), ("temperature", "1"),
    ("temperature", float("inf")),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", -0.5), ("top_p", None),
    ("top_k", -2), ("top_k", 2.5), ("top_k", "5"),
    ("min_p", -0.01), ("min_p", 1.01),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("presence_penalty", 2.5), ("presence_penalty", -2.01),
    ("frequency_penalty", 2.01), ("frequency_penalty", -3),
    ("logit_bias", {"abc": 1.0}), ("logit_bias", {-1: 1.0}), ("logit_bias", {5: 101}),
    ("logit_bias", {5: -100.5}), ("logit_bias", {"5": "x"}), ("logit_bias", [1, 2]),
    ("seed", 1.5), ("seed", "7"), ("seed", True), ("seed", 2**64),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", 2.0),
    ("stop", ""), ("stop", ["ok", ""]), ("stop", 5), ("stop", ["a", 3]),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["1"]), ("stop_token_ids", "12"),
    ("ignore_eos", 1), ("include_stop_str_in_output", "yes"), ("skip_special_tokens", None), ("speculate", 0),
    ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", 1.0),
    ("min_tokens", -1), ("min_tokens", 0.5),
    ("structured", {"type": "json_object"}), ("structured", "json"),
    ("thinking", {"budget": 3}), ("thinking", 3),
]


@pytest.mark.parametrize(("field", "value"), INVALID, ids=[f"{f}={v!r}" for f, v in INVALID])
def test_invalid_field_rejected_with_its_name(field: str, value: object) -> None:
    with pytest.raises(ValueError) as ei:
        SamplingParams(**{field: value})
    assert str(ei.value).startswith(f"{field}:"), str(ei.value)


def test_every_field_has_an_invalid_case() -> None:
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    assert fields == {f for f, _ in INVALID}


def test_thinking_spec_checked() -> None:
    from hitenter.sampling_params import ThinkingSpec
    for bad in ({"start": (), "end": (2,)}, {"start": (1,), "end": [2]}, {"start": (1,), "end": (-2,)},
                {"start": (1,), "end": (2,), "budget": -1}, {"start": (1,), "end": (2,), "budget": 1.5}):
        with pytest.raises(ValueError, match="^thinking: "):
            ThinkingSpec(**bad)  # type: ignore[arg-type]
    spec = ThinkingSpec((1,), (2,), budget=0)
    assert spec.force == (2,)
    with pytest.raises(ValueError, match="^thinking: token id 9 is out of range"):
        SamplingParams(thinking=ThinkingSpec((9,), (2,))).validate_for_vocab(5)


def test_min_tokens_above_max_tokens_accepted() -> None:
    # max_tokens is a hard cap (check_token_stop: "length" wins); as with max_tokens null, where the
    # window decides the cap, min_tokens beyond it just means no EOS / stop-token stop before the cap
    assert SamplingParams(max_tokens=3, min_tokens=4).min_tokens == 4
    assert SamplingParams(max_tokens=3, min_tokens=3).min_tokens == 3
    assert SamplingParams(min_tokens=100).max_tokens is None


def test_message_states_the_range() -> None:
    with pytest.raises(ValueError, match=r"temperature: must be a number in \[0, 2\].*got 3"):
        SamplingParams(temperature=3)
    with pytest.raises(ValueError, match=r"top_p: must be a number in \(0, 1\]"):
        SamplingParams(top_p=0)


def test_unknown_keyword_is_type_error() -> None:
    with pytest.raises(TypeError):
        SamplingParams(temprature=0.5)  # type: ignore[call-arg]


def test_defaults_and_normalization() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, -1, 0.0)
    assert p.stop == [] and p.stop_token_ids == [] and p.logit_bias == {}
    assert p.skip_special_tokens is True and p.max_tokens is None and not p.is_greedy
    q = SamplingParams(stop="###", logit_bias={"42": 5, 7: -100}, top_k=0, stop_token_ids=(3, 4))
    assert q.stop == ["###"] and q.logit_bias == {42: 5.0, 7: -100.0} and q.stop_token_ids == [3, 4]
    assert SamplingParams(temperature=0).is_greedy and SamplingParams(temperature=0.0, top_k=5).is_greedy
    assert q.max_stop_len == 3


def test_frozen_and_replace_revalidates() -> None:
    p = SamplingParams(temperature=0.7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 1.0  # type: ignore[misc]
    assert p.replace(top_k=5).top_k == 5 and p.top_k == -1
    with pytest.raises(ValueError, match="^top_k:"):
        p.replace(top_k=-3)


def test_validate_for_vocab() -> None:
    SamplingParams(logit_bias={99: 1.0}, stop_token_ids=[99]).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"^logit_bias: token id 100 .*0\.\.99"):
        SamplingParams(logit_bias={"100": 1.0}).validate_for_vocab(100)
    with pytest.raises(ValueError, match="^stop_token_ids:"):
        SamplingParams(stop_token_ids=[500]).validate_for_vocab(100)
