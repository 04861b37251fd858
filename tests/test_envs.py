"""hitenter/envs.py is the one place that reads or writes the environment, and declares every switch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hitenter import envs, omp_wait
from hitenter.cli import main

PKG = Path(__file__).resolve().parents[1] / "hitenter"
ENV_ACCESS = re.compile(r"\bos\.(environ|getenv|putenv|unsetenv)\b|\bfrom os import [^\n]*\b(environ|getenv|putenv)\b")
NAME = re.compile(r"\bHITENTER_[A-Z0-9_]*[A-Z0-9]\b")


def sources() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def env_access(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if ENV_ACCESS.search(line)]


def test_only_envs_touches_the_environment() -> None:
    found = [f"{p.relative_to(PKG.parent)}: {line}" for p in sources() if p.name != "envs.py" or p.parent != PKG
             for line in env_access(p.read_text())]
    assert not found, "read and write the environment through hitenter/envs.py:\n" + "\n".join(found)


def test_every_hitenter_name_in_the_package_is_declared() -> None:
    named = {m: p.relative_to(PKG.parent) for p in sources() for m in NAME.findall(p.read_text())}
    missing = {m: str(p) for m, p in named.items() if m not in envs.ENVS}
    assert not missing, f"declare these in hitenter/envs.py: {missing}"


def test_the_checks_see_what_they_look_for() -> None:
    assert env_access('x = os.environ.get("A")\ny = os.getenv("B")\nfrom os import environ\nz = 1')[:3] == [
        'x = os.environ.get("A")', 'y = os.getenv("B")', "from os import environ"]
    assert not env_access("environment = 1  # the os environment")
    assert NAME.findall("HITENTER_X=0, HITENTER_..., HITENTER_A_B") == ["HITENTER_X", "HITENTER_A_B"]


def test_values_are_read_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HITENTER_REPACK", raising=False)
    assert envs.HITENTER_REPACK.get() is True
    monkeypatch.setenv("HITENTER_REPACK", "0")
    assert envs.HITENTER_REPACK.get() is False and envs.flag("HITENTER_REPACK") is False
    monkeypatch.setenv("HITENTER_GGUF_REFERENCE", "1")
    assert envs.HITENTER_GGUF_REFERENCE.get() is True
    monkeypatch.setenv("HITENTER_GGUF_REFERENCE", "yes")      # a default-off switch turns on with 1 only
    assert envs.HITENTER_GGUF_REFERENCE.get() is False
    monkeypatch.setenv("HITENTER_DRAFT_VOCAB", "0")
    assert envs.HITENTER_DRAFT_VOCAB.get() == 0
    monkeypatch.setenv("HITENTER_TP_TIMEOUT_S", "2.5")
    assert envs.HITENTER_TP_TIMEOUT_S.get() == 2.5
    monkeypatch.setenv("HITENTER_HOME", str(tmp_path / "h"))
    assert envs.HITENTER_HOME.get() == tmp_path / "h"
    monkeypatch.setenv("HITENTER_HOME", "")
    assert envs.HITENTER_HOME.get() == Path.home() / ".cache" / "hitenter"
    monkeypatch.setenv("HITENTER_QMATMUL_ISA", "generic")
    assert envs.text("HITENTER_QMATMUL_ISA") == "generic"


def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HITENTER_DRAFT_VOCAB", "lots")
    with pytest.raises(ValueError, match="HITENTER_DRAFT_VOCAB='lots': expected an integer"):
        envs.HITENTER_DRAFT_VOCAB.get()
    monkeypatch.setenv("HITENTER_DISAGG_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="HITENTER_DISAGG_TIMEOUT_S='soon': expected a number"):
        envs.HITENTER_DISAGG_TIMEOUT_S.get()
    with pytest.raises(KeyError, match="HITENTER_NOPE is not a Flag declared"):
        envs.flag("HITENTER_NOPE")
    with pytest.raises(KeyError, match="is not a Text declared"):
        envs.text("HITENTER_REPACK")


def test_child_env_puts_the_source_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("HITENTER_REPACK", "0")
    env = envs.child_env(pythonpath_first="/src")
    assert env["PYTHONPATH"] == "/src:/elsewhere" and env["HITENTER_REPACK"] == "0"
    monkeypatch.delenv("PYTHONPATH")
    assert envs.child_env(pythonpath_first="/src")["PYTHONPATH"] == "/src"
    assert "PYTHONPATH" not in envs.child_env()


def test_set_unless_leaves_a_choice_alone() -> None:
    fresh: dict[str, str] = {}
    omp_wait.configure(fresh)
    assert fresh == {"GOMP_SPINCOUNT": omp_wait.SPIN_COUNT}
    for chosen in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "passive"}):
        env = dict(chosen)
        omp_wait.configure(env)
        assert env == chosen


def test_hitenter_envs_lists_every_variable(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HITENTER_DRAFT_VOCAB", "123")
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name}=" in out for name in envs.ENVS)
    assert "HITENTER_DRAFT_VOCAB=123\n" in out and "HITENTER_REPACK=1 (default)" in out
