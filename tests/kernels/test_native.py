"""One way to load native code (hitenter/kernels/native.py): every C source under kernels/csrc is a
NativeLibrary that knows every header it includes, no other module opens a shared library of ours, and
without a compiler the engine still generates, with exactly one warning per library that failed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hitenter.kernels.native import CSRC, DECODE_LAYER, LIBRARIES, NativeLibrary
from hitenter.testing.paths import PACKAGE


def test_every_c_source_is_one_declared_library() -> None:
    sources = sorted(lib.source.name for lib in LIBRARIES)
    assert sources == sorted(p.name for p in CSRC.rglob("*.c"))
    assert len({lib.name for lib in LIBRARIES}) == len(LIBRARIES)


@pytest.mark.parametrize("lib", LIBRARIES, ids=lambda lib: lib.name)
def test_the_cache_key_covers_every_included_header(lib: NativeLibrary) -> None:
    """Each quoted #include of the source and of its headers, read here line by line, is a header the build
    hashes (a change to any of them rebuilds the library)."""
    headers = set(lib.headers)
    for f in (lib.source, *lib.headers):
        for line in f.read_text().splitlines():
            m = re.match(r'\s*#\s*include\s+"(.+)"', line)
            if m:
                assert (f.parent / m.group(1)).resolve() in headers, f"{lib.name}: {f.name} includes {m.group(1)}"


def test_every_header_belongs_to_a_library() -> None:
    used = {h for lib in LIBRARIES for h in lib.headers}
    assert used == {p.resolve() for p in CSRC.rglob("*.h")}
    assert "vec16.h" in {h.name for h in DECODE_LAYER.headers}


def test_no_other_module_opens_a_library() -> None:
    """Only native.py dlopens our code and calls the build; the one other CDLL is the C library itself
    (arena.py: CDLL(None), nothing built)."""
    opens = re.compile(r"\bCDLL\(|LoadLibrary\(|\bbuild_library\(|\bload_library\(|kernels\.build import")
    found = []
    for py in PACKAGE.rglob("*.py"):
        if py.name in ("native.py", "build.py") and py.parent.name == "kernels":
            continue
        for n, line in enumerate(py.read_text().splitlines(), 1):
            if opens.search(line) and "CDLL(None" not in line:
                found.append(f"{py.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not found, found


def test_an_undeclared_instance_is_refused() -> None:
    with pytest.raises(ValueError, match="no instance"):
        DECODE_LAYER.instance("other")


SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="LOG %(levelname)s %(name)s %(message)s")
from hitenter import LLM, SamplingParams
from hitenter.kernels.native import LIBRARIES
llm = LLM(sys.argv[1])
outs = llm.generate(["hello world", "the cat"], [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                                                 SamplingParams(max_tokens=6, temperature=0.8, seed=1, ignore_eos=True)])
print(json.dumps({"tokens": [o.outputs[0].token_ids for o in outs],
                  "libraries": {lib.name: [lib.what, lib.status] for lib in LIBRARIES}}))
"""


@pytest.mark.slow
def test_without_a_compiler_the_engine_generates_with_one_warning_per_library(tmp_path: Path) -> None:
    from hitenter.testing.tiny_model import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "tiny.gguf", quant="Q8_0")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "CC": "/nonexistent/cc", "HITENTER_HOME": str(home)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(model)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert [len(t) for t in got["tokens"]] == [6, 6]
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("LOG WARNING")]
    libs = got["libraries"]
    assert libs["qmatmul"][1].startswith("failed") and libs["decode_attention"][1].startswith("failed")
    assert libs["race"][1].startswith("failed")                       # the seeded row sampled through it
    assert libs["decode_layer"][1] in ("needs qmatmul, decode_attention", "not loaded yet")   # never built
    for name, (what, status) in libs.items():
        said = [ln for ln in warnings if f" {what} unavailable" in ln]
        assert len(said) == (1 if status.startswith("failed") else 0), (name, status, said)
    assert len(warnings) == sum(s.startswith("failed") for _, s in libs.values()), warnings
    assert not list(home.rglob("*.so"))


def test_a_compiler_timeout_stops_the_whole_compiler(tmp_path: Path) -> None:
    """The driver's children (cc1) go too: a shell that starts a child, killed at the timeout, leaves none."""
    from hitenter.kernels.build import run_compiler

    pid_file = tmp_path / "child"
    with pytest.raises(subprocess.TimeoutExpired):
        run_compiler(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], timeout=0.5)
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")
    for _ in range(50):   # gone, or a zombie waiting for its reaper: not running either way
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"the compiler's child outlived the timeout: {stat.read_text()}")


def test_build_gives_the_file_that_a_load_opens() -> None:
    from hitenter.kernels.native import RACE

    if RACE() is None:
        pytest.skip("no race kernel here")
    assert str(RACE.build()) == RACE._lib._name
    with pytest.raises(ValueError, match="no instance"):
        RACE.build(tag="portable")


def test_the_session_prebuild_covers_every_library_instance_and_forced_variant(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hitenter.kernels.native import QMATMUL, RACE
    from hitenter.testing.prebuild import jobs

    monkeypatch.delenv("HITENTER_QMATMUL_ISA", raising=False)
    got = {(lib.name, variant, tag) for lib, variant, tag in jobs(["tests/a.py::t[avx2]", "tests/b.py::u"])}
    want = {(lib.name, "auto" if lib.variants else "", "") for lib in LIBRARIES}
    want |= {(lib.name, "", tag) for lib in LIBRARIES for tag in lib.instances}
    want |= {("qmatmul", "generic", ""), ("qmatmul", "avx2", "")}
    assert got == want
    assert jobs([])[0][0].name == "decode_attention" and jobs([])[0][2] == "portable"   # the slowest first
    monkeypatch.setenv(RACE.env, "0")
    monkeypatch.setenv(QMATMUL.variant_env, "generic")
    got = {(lib.name, variant, tag) for lib, variant, tag in jobs([])}
    assert ("race", "", "") not in got and ("qmatmul", "generic", "") in got and ("qmatmul", "auto", "") not in got
