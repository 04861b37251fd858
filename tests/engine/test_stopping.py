"""Token-level stop checks: eog, stop_token_ids, max_tokens, ignore_eos and min_tokens."""

from __future__ import annotations

from hitenter.engine.stopping import check_token_stop
from hitenter.sampling_params import SamplingParams as SP

EOG = frozenset({2, 7})


def test_eog_stops_with_no_stop_reason() -> None:
    assert check_token_stop(2, 1, SP(), EOG, 10) == ("stop", None)
    assert check_token_stop(7, 5, SP(), EOG, 10) == ("stop", None)
    assert check_token_stop(3, 5, SP(), EOG, 10) is None


def test_ignore_eos() -> None:
    assert check_token_stop(2, 3, SP(ignore_eos=True), EOG, 10) is None
    assert check_token_stop(2, 10, SP(ignore_eos=True), EOG, 10) == ("length", None)
    assert check_token_stop(5, 3, SP(ignore_eos=True, stop_token_ids=[5]), EOG, 10) == ("stop", 5)


def test_stop_token_ids_reason_is_the_id() -> None:
    p = SP(stop_token_ids=[11, 12])
    assert check_token_stop(12, 4, p, EOG, 10) == ("stop", 12)
    assert check_token_stop(13, 4, p, EOG, 10) is None


def test_max_tokens_is_length_and_stop_wins_on_the_last_token() -> None:
    assert check_token_stop(3, 9, SP(), EOG, 10) is None
    assert check_token_stop(3, 10, SP(), EOG, 10) == ("length", None)
    assert check_token_stop(2, 10, SP(), EOG, 10) == ("stop", None)
    assert check_token_stop(3, 10**6, SP(), EOG, None) is None


def test_min_tokens_blocks_eog_and_stop_ids_but_not_length() -> None:
    p = SP(min_tokens=3, max_tokens=3, stop_token_ids=[9])
    for n in (1, 2):
        assert check_token_stop(2, n, p, EOG, 3) is None
        assert check_token_stop(9, n, p, EOG, 3) is None
    assert check_token_stop(2, 3, p, EOG, 3) == ("length", None)
    p = SP(min_tokens=3, stop_token_ids=[9])
    assert check_token_stop(2, 3, p, EOG, 10) is None
    assert check_token_stop(2, 4, p, EOG, 10) == ("stop", None)
    assert check_token_stop(9, 4, p, EOG, 10) == ("stop", 9)


def test_finish_reason_only_stop_or_length() -> None:
    p = SP(stop_token_ids=[1, 2, 3], min_tokens=2)
    reasons = {r[0] for t in range(10) for n in range(1, 12)
               if (r := check_token_stop(t, n, p, EOG, 10)) is not None}
    assert reasons == {"stop", "length"}


def test_min_tokens_above_max_tokens_stops_at_max_tokens() -> None:
    p = SP(min_tokens=5, max_tokens=3, stop_token_ids=[9])
    assert check_token_stop(9, 2, p, EOG, 3) is None
    assert check_token_stop(2, 3, p, EOG, 3) == ("length", None)
