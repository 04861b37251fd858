"""The package's layers point down only, and no module imports another in a circle (lazy ones included).

Every module's imports of hitenter are read from its source (ast: the top level, functions and
``if TYPE_CHECKING:`` blocks alike). A module belongs to the layer of its longest matching prefix in
LAYERS (lowest first); it may import its own unit, and any unit of a lower layer, nothing higher. Units
of one layer (models and kv_cache, llm and server) may import each other one way only: the graph of
units has no cycle, and neither has the graph of modules. hitenter.testing is for tests: it may import
anything and nothing in the package imports it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "hitenter"

# (layer, its units), lowest first. A unit is a module or a package prefix; the longest match wins.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("hitenter.envs", "hitenter.errors", "hitenter.config", "hitenter.paths",
                    "hitenter.omp_wait", "hitenter.onednn_isa", "hitenter.import_gc")),
    ("request types", ("hitenter.sampling_params", "hitenter.request", "hitenter.outputs")),
    ("tokenizer", ("hitenter.tokenizer",)),
    ("kernels", ("hitenter.kernels",)),
    ("quant", ("hitenter.quant",)),               # weight formats the model layers use
    ("models, kv_cache", ("hitenter.models", "hitenter.kv_cache")),
    ("engine", ("hitenter.engine",)),             # scheduler, runner, sampler, speculative, the builder, LLMEngine
    ("distributed", ("hitenter.distributed",)),   # runners over processes, registered with engine/runner_registry
    ("entry points", ("hitenter.llm", "hitenter.server", "hitenter.remote",   # remote: a running server's client
                      "hitenter.engine_options")),   # imports hitenter.distributed when the options ask for it
    ("command line", ("hitenter.cli",)),
    ("package", ("hitenter",)),                   # hitenter/__init__.py: the public names
)
TESTING = "hitenter.testing"
RANK = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}
Edge = tuple[str, str, int]        # (importer, imported, line)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = modules()


def unit_of(module: str) -> str | None:
    """The longest LAYERS prefix of `module` (the bare package only for itself), None when none is."""
    best = None
    for unit in RANK:
        if module == unit or (unit != "hitenter" and module.startswith(unit + ".")):
            best = unit if best is None or len(unit) > len(best) else best
    return best


def imported(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """The hitenter modules `module` imports, with the line, and the names that resolve to no module."""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hitenter":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = ".".join(base[:len(base) - node.level + 1] + ([source] if source else []))
            if source.split(".")[0] != "hitenter":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield (sub if sub in MODULES else source), node.lineno


def edges() -> list[Edge]:
    return sorted({(m, target, line) for m, path in MODULES.items() for target, line in imported(m, path)
                   if target != m})


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_every_module_has_a_layer() -> None:
    homeless = [m for m in MODULES if unit_of(m) is None and not m.startswith(TESTING)]
    assert not homeless, f"add these modules to LAYERS in {__file__}: {homeless}"


def test_imports_name_existing_modules() -> None:
    missing = [f"{src} line {line}: {target}" for src, target, line in edges() if target not in MODULES]
    assert not missing, missing


def test_imports_point_down() -> None:
    up = []
    for src, target, line in edges():
        if src.startswith(TESTING) or target not in MODULES or target.startswith(TESTING):
            continue
        s, t = unit_of(src), unit_of(target)
        if s is not None and t is not None and RANK[t] > RANK[s]:
            up.append(f"{src} line {line} imports {target} ({t} is above {s})")
    assert not up, "\n".join(up)


def test_nothing_imports_the_test_helpers() -> None:
    users = [f"{src} line {line}" for src, target, line in edges()
             if target.startswith(TESTING) and not src.startswith(TESTING)]
    assert not users, users


def test_no_import_circles_between_modules() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for src, target, _ in edges():
        if target in MODULES:
            graph[src].add(target)
    found = cycles(graph)
    assert not found, found


def test_no_import_circles_between_units() -> None:
    graph: dict[str, set[str]] = {unit: set() for unit in RANK}
    for src, target, _ in edges():
        s, t = unit_of(src), unit_of(target)
        if s is not None and t is not None and s != t:
            graph[s].add(t)
    found = cycles(graph)
    assert not found, found


def test_the_checks_catch_what_they_look_for() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert unit_of("hitenter.engine.scheduler") == "hitenter.engine"
    assert unit_of("hitenter.engine.llm_engine") == "hitenter.engine"
    assert unit_of("hitenter.unplaced") is None
    assert RANK["hitenter.kernels"] < RANK["hitenter.models"] < RANK["hitenter.engine"] < RANK["hitenter.server"]
    assert RANK["hitenter.engine"] < RANK["hitenter.distributed"] < RANK["hitenter.llm"]   # engine never imports it
