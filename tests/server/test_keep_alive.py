"""Ollama's keep_alive values (hitenter/server/keep_alive.py), against Go's time.ParseDuration grammar."""

from __future__ import annotations

import pytest

from hitenter.server.keep_alive import parse_keep_alive


@pytest.mark.parametrize("value,seconds", [
    (300, 300.0), (0, 0.0), (2.5, 2.5), (-1, None), (-0.5, None), ("5m", 300.0), ("30s", 30.0), ("0", 0.0),
    ("1h30m", 5400.0), ("1.5h", 5400.0), ("500ms", 0.5), ("-1m", None), ("+10s", 10.0), ("2h0m0s", 7200.0),
    ("1us", 1e-6), ("1µs", 1e-6), (".5s", 0.5),
])
def test_values(value: float | str, seconds: float | None) -> None:
    got = parse_keep_alive(value)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


@pytest.mark.parametrize("value", ["", "5", "300", "5 m", "5min", "m", "1d", "abc", "1h-5m", True, "nan"])
def test_refused(value: object) -> None:
    with pytest.raises(ValueError):
        parse_keep_alive(value)  # type: ignore[arg-type]


def test_the_flag_also_takes_bare_seconds() -> None:
    assert parse_keep_alive("300", bare_seconds=True) == 300.0
    assert parse_keep_alive("-1", bare_seconds=True) is None
    assert parse_keep_alive("5m", bare_seconds=True) == 300.0
    with pytest.raises(ValueError):
        parse_keep_alive("5 minutes", bare_seconds=True)
