"""Every repository file that hitenter's source text names exists, so a docstring cannot point at a file
that was moved or deleted.

Checked in hitenter/'s Python, C and web sources (docstrings, comments, strings alike):
- repo paths: ``hitenter/...``, ``tests/...``, ``scripts/...``, ``docs/...``, ``bench/...``, ``.ci/...``
  (a ``*`` in one is a glob that must match something);
- ``csrc/<file>``: a native source under hitenter/kernels/csrc/;
- a bare ``name.py``: some file of that name somewhere in the repository (a sibling module named without
  its folder), unless it is a known file of another project (``EXTERNAL``).
A name inside a longer path (``conversion/qwen.py``, llama.cpp's ``src/models/x.cpp``) is another
project's and is not checked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = {".py", ".c", ".h", ".js", ".html", ".css"}
SKIP_DIRS = {"__pycache__", "node_modules"}
EXTERNAL = {"convert_hf_to_gguf.py"}   # llama.cpp's converter, named by the tiny-model writers

_EDGE = r"(?<![\w./*-])"
REPO_PATH = re.compile(_EDGE + r"((?:hitenter|tests|scripts|docs|bench|\.ci)/[\w./*-]*[\w*])")
CSRC_PATH = re.compile(_EDGE + r"csrc/((?:[\w-]+/)?[\w.-]+\.[ch])\b")   # a kernel family's folder, then the file
BARE_MODULE = re.compile(_EDGE + r"([A-Za-z_][\w]*\.py)\b(?!/)")


def source_files(root: Path) -> list[Path]:
    out = []
    for d, dirs, files in os.walk(root / "hitenter"):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")]
        out += [Path(d) / f for f in files if Path(f).suffix in SOURCE_SUFFIXES]
    return sorted(out)


def repo_file_names(root: Path) -> set[str]:
    names: set[str] = set()
    for _, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")]
        names.update(files)
    return names


def path_exists(root: Path, path: str) -> bool:
    path = path.rstrip("./")
    if "*" in path:
        return any(root.glob(path))
    return (root / path).exists()


def stale_references(root: Path) -> list[str]:
    """'file:line: name' for every named path in hitenter/'s sources that does not exist under `root`."""
    names = repo_file_names(root)
    problems = []
    for f in source_files(root):
        rel = f.relative_to(root)
        for lineno, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            missing = [p for p in REPO_PATH.findall(line) if not path_exists(root, p)]
            missing += ["csrc/" + c for c in CSRC_PATH.findall(line)
                        if not (root / "hitenter/kernels/csrc" / c).exists()]
            missing += [m for m in BARE_MODULE.findall(line) if m not in names and m not in EXTERNAL]
            problems += [f"{rel}:{lineno}: {m}" for m in missing]
    return problems


def test_paths_named_in_source_exist() -> None:
    problems = stale_references(REPO)
    assert not problems, "files named in hitenter/ that do not exist:\n" + "\n".join(problems)


def test_the_check_sees_paths() -> None:
    # the scan finds the references it is meant to check (a regex that matched nothing would pass vacuously)
    text = "see tests/models/test_decoder.py and csrc/qmatmul/qmatmul.c, engine_setup.py; not conversion/qwen.py"
    assert REPO_PATH.findall(text) == ["tests/models/test_decoder.py"]
    assert CSRC_PATH.findall(text) == ["qmatmul/qmatmul.c"]
    assert BARE_MODULE.findall(text) == ["engine_setup.py"]
    assert len(source_files(REPO)) > 100
