"""The shape of the package, held by tests: no import circle between durable's modules (the
imports made only for type checking included), and the core that decides (the run
protocol and the lifecycle) imports no driver, host or database client."""

from __future__ import annotations

import ast
from pathlib import Path

import durable

ROOT = Path(durable.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, at run time or
    for type checking alike (an import inside `if TYPE_CHECKING:` still ties the two)."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in paths and target != name:
                    graph[name].add(target)
                    break
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _imports()
    # The package's __init__ imports the public surface; a module that imported `durable`
    # itself would close a circle through it.
    importers_of_the_package = sorted(m for m, deps in graph.items() if "durable" in deps)
    assert importers_of_the_package == [], importers_of_the_package
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


CORE = ("durable._protocol", "durable._lifecycle")
NOT_IN_THE_CORE = (
    "durable._driver",
    "durable._driver_async",
    "durable._runner",
    "durable._async_host",
    "durable._engine",
    "durable._client",
    "durable._systemdb",
    "durable._recovery",
)


def _core_modules() -> dict[str, Path]:
    """Each module of the core -> its file: a core package counts with every module in it."""
    found: dict[str, Path] = {}
    for core in CORE:
        leaf = core.rpartition(".")[2]
        package = ROOT / leaf
        if package.is_dir():
            for path in sorted(package.rglob("*.py")):
                found[_module_name(path)] = path
        else:
            found[core] = ROOT / f"{leaf}.py"
    return found


def test_the_core_imports_no_driver_host_or_database() -> None:
    graph = _imports()
    modules = _core_modules()
    assert "durable._protocol.effects" in modules  # the package is walked, not only __init__
    for core, path in modules.items():
        assert not graph[core] & set(NOT_IN_THE_CORE), (core, graph[core])
        source = path.read_text("utf-8")
        for client in ("import psycopg", "import sqlalchemy", "import threading"):
            assert client not in source, (core, client)
