"""The command line's tests never talk to a hitenter server that happens to run on this machine: ``run``
and ``chat`` look for one at $HITENTER_HOST (hitenter/remote.py), here a port nothing listens on unless
a test starts its own server there."""

from __future__ import annotations

import pytest

from hitenter.testing.net import free_port


@pytest.fixture(autouse=True)
def no_server_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_HOST", f"127.0.0.1:{free_port()}")
