"""The README and docs/ name only what exists, and document everything a user can set.

Every markdown file (README.md, docs/**/*.md) is read as text, without loading a model:
- each repository path it names (`hitenter/...`, `tests/...`, `bench/...`, `scripts/...`, `docs/...`, `.ci/...`)
  exists, and each dotted `hitenter.x.y` module reference is a module (or a name defined in one);
- each relative markdown link resolves to a file, and its `#anchor` to a heading of that file;
- each `hitenter <subcommand> --flag ...` command is a real subcommand with real flags (the CLI's own
  argparse parser), and each `bench/x.py --flag ...` command uses flags the script declares;
- every subcommand and flag of the CLI, every model family and every `HITENTER_*` variable the code reads
  is documented (docs/usage.md, docs/models.md, docs/envs.md);
- README.md is under 250 lines and carries the test command `.ci/run` runs.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
PATH_ROOTS = ("hitenter/", "tests/", "bench/", "scripts/", "docs/", ".ci/")

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_PATH = re.compile(r"(?<![\w./~-])((?:hitenter|tests|bench|scripts|docs|\.ci)/[\w./*<>{}-]*)")
_DOTTED = re.compile(r"(?<![\w./-])hitenter(?:\.[A-Za-z_]\w*)+")
_HITENTER_CMD = re.compile(r"(?:^|(?<=[\s;&|(`/]))hitenter[ \t]+([a-z][\w-]*)((?:[ \t]+[^\s;&|#`]+)*)")
_BENCH_CMD = re.compile(r"(?<![\w/])(bench/\w+\.py)((?:[ \t]+[^\s;&|#`]+)*)")
_ENV = re.compile(r"\bHITENTER_[A-Z0-9_]*[A-Z0-9]")


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def code_spans(text: str) -> Iterator[str]:
    """Fenced blocks, then the inline code spans of the text outside them."""
    for m in _FENCE.finditer(text):
        yield m.group(0)
    yield from _INLINE.findall(_FENCE.sub("", text))


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


# ---------------------------------------------------------------- paths and modules


def path_problems(root: Path = ROOT) -> list[str]:
    bad = []
    for md in markdown_files(root):
        text = md.read_text()
        for m in _PATH.finditer(text):
            p = m.group(1).split("::")[0].rstrip(".,:;")
            if any(c in p for c in "<>*{}") or "..." in p:
                continue          # a pattern, not a path (tests/server/<api>/)
            if not (root / p).exists():
                bad.append(f"{_rel(md, root)}: {p} does not exist")
        for m in _DOTTED.finditer(text):
            problem = module_problem(root, m.group(0))
            if problem:
                bad.append(f"{_rel(md, root)}: {problem}")
    return bad


def _defined_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def module_problem(root: Path, dotted: str) -> str | None:
    """`hitenter.a.b[.name]`: the longest module prefix must exist, and at most one name may follow it,
    defined at the top of that module."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:n])
        mod = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if mod.is_file():
            rest = parts[n:]
            if not rest:
                return None
            if len(rest) == 1 and rest[0] in _defined_names(mod):
                return None
            return f"{dotted}: {'.'.join(rest)} is not defined in {_rel(mod, root)}"
    return f"{dotted} is not a module"


# ---------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    h = heading.strip().replace("`", "").replace("*", "").lower()
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    text = _FENCE.sub("", md.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def link_problems(root: Path = ROOT) -> list[str]:
    bad = []
    for md in markdown_files(root):
        for target in _LINK.findall(_FENCE.sub("", md.read_text())):
            if re.match(r"[a-z]+:", target):
                continue          # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part).resolve() if file_part else md
            if not dest.exists():
                bad.append(f"{_rel(md, root)}: link {target} does not resolve")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{_rel(md, root)}: link {target}: no heading #{anchor} in {_rel(dest, root)}")
    return bad


# ---------------------------------------------------------------- commands and flags


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    from hitenter.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(args: str) -> list[str]:
    return [t.split("=")[0] for t in args.split() if re.fullmatch(r"--?[a-zA-Z][\w-]*(=\S*)?", t)]


def command_problems(root: Path = ROOT) -> list[str]:
    parsers = cli_parsers()
    bad = []
    for md in markdown_files(root):
        for span in code_spans(md.read_text()):
            for line in span.splitlines():
                line = re.sub(r"(^|\s)#.*$", "", line)          # a shell comment
                if re.search(r"\b(?:from|import|-m)[ \t]+hitenter\b", line):
                    line = re.sub(r"\b(?:from|import|-m)[ \t]+hitenter\S*", "", line)
                for m in _HITENTER_CMD.finditer(line):
                    cmd = m.group(1)
                    if cmd not in parsers:
                        bad.append(f"{_rel(md, root)}: `hitenter {cmd}` is not a subcommand ({line.strip()})")
                        continue
                    known = set(parsers[cmd]._option_string_actions)
                    bad += [f"{_rel(md, root)}: `hitenter {cmd}` has no flag {f} ({line.strip()})"
                            for f in _flags(m.group(2)) if f not in known]
    return bad


def bench_flags(script: Path) -> set[str]:
    src = script.read_text()
    flags = {"-h", "--help"}
    for call in re.finditer(r"add_argument\(([^)]*)", src):
        flags |= set(re.findall(r"[\"'](--?[\w-]+)[\"']", call.group(1)))
    return flags


def bench_problems(root: Path = ROOT) -> list[str]:
    bad = []
    for md in markdown_files(root):
        for span in code_spans(md.read_text()):
            for line in span.splitlines():
                for m in _BENCH_CMD.finditer(line):
                    script = root / m.group(1)
                    if not script.is_file():
                        bad.append(f"{_rel(md, root)}: {m.group(1)} does not exist")
                        continue
                    known = bench_flags(script)
                    bad += [f"{_rel(md, root)}: {m.group(1)} has no flag {f} ({line.strip()})"
                            for f in _flags(m.group(2)) if f not in known]
    return bad


# ---------------------------------------------------------------- completeness


def undocumented_cli(root: Path = ROOT) -> list[str]:
    usage = (root / "docs" / "usage.md").read_text()
    bad = []
    for name, parser in cli_parsers().items():
        if f"hitenter {name}" not in usage:
            bad.append(f"docs/usage.md: subcommand `hitenter {name}` is not documented")
        for action in parser._actions:
            long = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
            if long and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", usage) for o in long):
                bad.append(f"docs/usage.md: `hitenter {name} {long[0]}` is not documented")
    return sorted(set(bad))


def env_variables(root: Path = ROOT) -> set[str]:
    """Every HITENTER_* name in the package's Python sources (C macros aside)."""
    return {m for p in (root / "hitenter").rglob("*.py") for m in _ENV.findall(p.read_text())}


def env_problems(root: Path = ROOT) -> list[str]:
    code = env_variables(root) | {m for m in _ENV.findall((root / "tests" / "conftest.py").read_text())}
    documented = set(_ENV.findall((root / "docs" / "envs.md").read_text()))
    named = {v for md in markdown_files(root) for v in _ENV.findall(md.read_text())}
    return ([f"docs/envs.md: {v} is read by the code but not documented" for v in sorted(code - documented)]
            + [f"{v} is documented but no code reads it" for v in sorted(named - code)])


def family_problems(root: Path = ROOT) -> list[str]:
    from hitenter.models.families import SUPPORTED_ARCHITECTURES

    models = (root / "docs" / "models.md").read_text()
    return [f"docs/models.md: family `{a}` is not in its table" for a in SUPPORTED_ARCHITECTURES
            if f"| `{a}` |" not in models]


# ---------------------------------------------------------------- the tests


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES}"


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip()
    assert ci in (ROOT / "README.md").read_text(), f".ci/run's test command is not in README.md: {ci}"


@pytest.mark.parametrize("check", [path_problems, link_problems, command_problems, bench_problems,
                                   undocumented_cli, env_problems, family_problems],
                         ids=lambda f: f.__name__)
def test_docs_name_only_what_exists(check) -> None:  # type: ignore[no-untyped-def]
    problems = check()
    assert not problems, "\n".join(problems)


def test_the_checks_find_what_is_wrong(tmp_path: Path) -> None:
    """Each check reports a broken doc in a scratch copy of the docs (so none passes by finding nothing)."""
    (tmp_path / "docs").mkdir()
    for name in ("hitenter", "tests", "bench", "scripts", ".ci"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "docs" / "usage.md").write_text((ROOT / "docs" / "usage.md").read_text())
    (tmp_path / "docs" / "envs.md").write_text("`HITENTER_NOT_A_SWITCH`\n")
    (tmp_path / "docs" / "models.md").write_text("# Models\n")
    (tmp_path / "README.md").write_text(
        "# T\n\n## A heading\n\n[gone](docs/gone.md) [anchor](#no-such-heading) [ok](#a-heading)\n\n"
        "`hitenter/no_such_module.py` `hitenter.models.no_such_module` `hitenter.llm.NoSuchName`\n\n"
        "```bash\nhitenter serve --no-such-flag\nhitenter frobnicate\nbench/serving.py --no-such-flag\n```\n")
    paths = path_problems(tmp_path)
    assert any("no_such_module.py" in p for p in paths) and any("hitenter.models.no_such_module" in p for p in paths)
    assert any("NoSuchName" in p for p in paths)
    links = link_problems(tmp_path)
    assert any("docs/gone.md" in p for p in links) and any("#no-such-heading" in p for p in links)
    assert not any("#a-heading" in p for p in links)
    commands = command_problems(tmp_path)
    assert any("--no-such-flag" in p for p in commands) and any("frobnicate" in p for p in commands)
    assert any("--no-such-flag" in p for p in bench_problems(tmp_path))
    envs = env_problems(tmp_path)
    assert any("HITENTER_NOT_A_SWITCH" in p for p in envs) and any("HITENTER_HOME" in p for p in envs)
    assert any("`llama`" in p for p in family_problems(tmp_path))
    (tmp_path / "docs" / "usage.md").write_text("# Usage\n")
    assert any("--max-tokens" in p for p in undocumented_cli(tmp_path))
