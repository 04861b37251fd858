"""hitenter/import_gc.py: the collector is off during a first import, on again after it as it was, and what
the import made is frozen; a module already imported changes nothing."""

from __future__ import annotations

import gc
import importlib
import sys
from pathlib import Path

import pytest

from hitenter.import_gc import collector_paused


@pytest.fixture
def fresh_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"import_gc_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("class A:\n    pass\n\nTABLE = [A() for _ in range(1000)]\n"
                                         "import gc\nCOLLECTOR_ON = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("was_on", [True, False])
def test_first_import_runs_paused_then_freezes(fresh_module: str, was_on: bool) -> None:
    (gc.enable if was_on else gc.disable)()
    try:
        before = gc.get_freeze_count()
        with collector_paused(fresh_module):
            mod = importlib.import_module(fresh_module)
        assert mod.COLLECTOR_ON is False
        assert gc.isenabled() is was_on
        assert gc.get_freeze_count() >= before + 1000   # the module's objects are out of the collector's sight
    finally:
        gc.enable()


def test_an_imported_module_changes_nothing(fresh_module: str) -> None:
    importlib.import_module(fresh_module)
    before = gc.get_freeze_count()
    with collector_paused(fresh_module):
        assert gc.isenabled()
        garbage = [[] for _ in range(10)]
    assert gc.isenabled() and gc.get_freeze_count() == before and garbage
