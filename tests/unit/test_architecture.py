"""The shape of the package, checked on its source (no database, nothing imported).

- The tree is the architecture picture: every private module lives in its layer's package
  (`_base`, `_core`, `_io`, `_run`, `_client`, `_host`), and a layer imports only its own
  and the layers below it.
- No import cycle among durable's modules, of any kind: imports inside functions and
  imports under `if TYPE_CHECKING:` count too (a type-only import still ties two modules:
  each must be read to understand the other).
- The pure core (every module of the `_core` package) imports no database driver, no
  clock, no threads, and nothing of durable above the ground floor (`_base`).
- SQL text runs only in `_io/systemdb.py` and the run I/O it mixes in
  (`_io/runio_async.py`, and `_io/runio.py` generated from it): everywhere else a
  statement is named (a key of `_io/sql/queries.sql`) and handed to the SystemDB.
  `_io/migrate.py` (run by the SystemDB, on the migration files), the `_embedded` package
  and `testing.py` (which administer a cluster: create databases, read its data
  directory) are the named exceptions.
- The CLI is a client: it never reaches for the SystemDB or its statements.
- No module is over 800 lines, but for an allow-list of those still to be split.
- The worker loop (`_host/recovery.py`) is given what it uses: it imports none of the
  engine's parts and never reaches through an engine for them.
- The drivers route an operation by its class, never by its statement's name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from durable._io.systemdb import load_queries

PACKAGE = Path(__file__).resolve().parents[2] / "durable"
MODULES = {
    ("durable." + str(p.relative_to(PACKAGE).with_suffix("")).replace("/", ".")).removesuffix(
        ".__init__"
    ): p
    for p in PACKAGE.rglob("*.py")
}
# Files and packages.
SQL_ADMIN = {
    "_io/systemdb.py",
    "_io/shards.py",  # the systemdb's reads of one shard at a time
    "_io/runio_async.py",
    "_io/runio.py",
    "_io/migrate.py",
    "_embedded",
    "testing.py",
}
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text("utf-8"), filename=str(path))


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _imported_modules(module: str, tree: ast.Module) -> set[str]:
    """The durable modules `module` imports, at run time or for type checking alike."""
    out: set[str] = set()
    for node in _all_imports(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in MODULES}
            continue
        base = node.module or ""
        if node.level:
            package = module.rsplit(".", node.level)[0]
            base = f"{package}.{base}" if base else package
        if base in MODULES:
            out.add(base)
        for alias in node.names:  # `from durable import _driver` imports a module
            if f"{base}.{alias.name}" in MODULES:
                out.add(f"{base}.{alias.name}")
    out.discard(module)
    out.discard("durable")  # the package __init__ re-exports; importing it is not a cycle
    return out


def import_graph() -> dict[str, set[str]]:
    return {m: _imported_modules(m, _tree(p)) for m, p in MODULES.items() if m != "durable"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if state.get(nxt) is None:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state.get(node) is None:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_among_durable_modules() -> None:
    graph = import_graph()
    assert graph.get("durable._host.engine")
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_protocol_is_pure() -> None:
    forbidden = {"psycopg", "psycopg_pool", "sqlalchemy", "time", "threading", "asyncio", "socket"}
    # The core (the `_core` package: a run's decisions and the lifecycle around a run)
    # builds on the ground floor alone: no driver, host, client or database module.
    allowed = {"durable._core", "durable._base", "durable.errors", "durable.serialization"}
    core = sorted((PACKAGE / "_core").glob("*.py"))
    assert len(core) > 2, "the core is the _core package"
    for path in core:
        tree = _tree(path)
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(tree):  # TYPE_CHECKING imports too: the core names no driver
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{where} imports {name}"
                if name.startswith("durable."):
                    assert ".".join(name.split(".")[:2]) in allowed, f"{where} imports {name}"
        calls = {
            n.func.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        assert not calls & {"sleep", "execute", "connect", "cursor"}, where


# The layers, bottom first: the tree is the architecture picture (docs/architecture.md).
# A module imports modules of its own layer or of a layer below it, never above.
LAYER_NAMES = ["errors", "serialization", "_base", "_core", "_io", "_run", "_client", "_host"]
LAYERS = [f"durable.{name}" for name in LAYER_NAMES]


def _layer(module: str) -> int | None:
    package = ".".join(module.split(".")[:2])
    return LAYERS.index(package) if package in LAYERS else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, imported in sorted(graph.items()):
        here = _layer(module)
        for other in sorted(imported):
            there = _layer(other)
            if here is not None and there is not None and there > here:
                out.append(f"{module} -> {other}")
    return out


def test_layers_import_only_downward() -> None:
    graph = import_graph()
    assert {".".join(m.split(".")[:2]) for m in graph} >= set(LAYERS[2:])
    flat = [p.name for p in PACKAGE.glob("_*.py") if p.name != "__init__.py"]
    assert flat == [], f"a private module belongs in its layer's package: {flat}"
    assert layer_violations(graph) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {"durable._io.systemdb": {"durable._host.engine", "durable._base.models"}}
    assert layer_violations(graph) == ["durable._io.systemdb -> durable._host.engine"]


def _sql_calls(tree: ast.Module) -> list[tuple[int, str]]:
    """Calls that hand SQL text (not a statement name) to a connection or cursor."""
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr = node.func.attr
        if attr in {"exec_driver_sql", "executemany", "cursor", "query", "statement"}:
            bad.append((node.lineno, attr))
            continue
        on_conn = {"execute_on", "fetch_one_on", "run_on", "run_on_async", "app_run_async"}
        if attr in {"execute", "fetch_one", "fetch_all", *on_conn}:
            first = node.args[0] if node.args else None
            if attr in on_conn:
                first = node.args[1] if len(node.args) > 1 else None
            ok = isinstance(first, ast.Constant) and isinstance(first.value, str)
            ok = ok and bool(NAME.match(first.value))  # type: ignore[union-attr]
            # The driver passes on the statement named by a protocol operation (`op.name`).
            ok = ok or (isinstance(first, ast.Attribute) and first.attr == "name")
            if not ok:
                bad.append((node.lineno, attr))
    return bad


def test_sql_runs_only_in_the_systemdb() -> None:
    offenders = {
        path.name: calls
        for path in PACKAGE.rglob("*.py")
        if not {path.relative_to(PACKAGE).parts[0], path.relative_to(PACKAGE).as_posix()}
        & SQL_ADMIN
        and (calls := _sql_calls(_tree(path)))
    }
    assert offenders == {}


def test_the_sql_check_catches_raw_sql() -> None:
    source = "def f(db, conn):\n    conn.execute('SELECT 1')\n    db.execute('get_workflow', {})\n"
    assert _sql_calls(ast.parse(source)) == [(2, "execute")]
    assert _sql_calls(ast.parse("conn.exec_driver_sql(q)")) == [(1, "exec_driver_sql")]


def test_every_named_statement_exists() -> None:
    queries = load_queries()
    used: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(_tree(path)):
            # Execute("name", ...), AppExecute("name", ...), db.fetch_one("name", ...)
            if isinstance(node, ast.Call) and node.args:
                first = node.args[0]
                func = node.func
                fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if fname in {
                    "Execute",
                    "AppExecute",
                    "execute",
                    "fetch_one",
                    "fetch_all",
                } and isinstance(first, ast.Constant):
                    used.add(str(first.value))
    missing = {name for name in used if NAME.match(name)} - set(queries)
    assert used and not missing, missing


def test_the_cli_is_a_client() -> None:
    paths = sorted((PACKAGE / "cli").glob("*.py"))
    assert len(paths) > 1
    # The MCP server is a client too: everything it reads or does goes through Client methods.
    for path in [*paths, PACKAGE / "integrations" / "mcp.py"]:
        tree = _tree(path)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert "SystemDB" not in names, path.name
        assert "db" not in attrs, (
            f"cli/{path.name} reaches into client.db: give the Client a method"
        )
        assert not {"fetch_one", "fetch_all", "execute"} & attrs, path.name


MAX_LINES = 800
# Modules still over MAX_LINES. The list only shrinks: a module split below the limit must
# leave it (the second test fails until it does), and no other module may join it.
OVER_MAX_LINES: set[str] = set()
# A catalogue kept whole by rule, not a module of logic: every public exception lives in
# errors.py (each a few lines of message), so it grows with the API and is not split.
CATALOGUES = {"errors.py"}


def _line_count(path: Path) -> int:
    return len(path.read_text("utf-8").splitlines())


def test_no_module_is_over_the_line_limit() -> None:
    """A module over the limit holds more than one concept: split it by concept."""
    over = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := _line_count(path)) > MAX_LINES
        and str(path.relative_to(PACKAGE)) not in OVER_MAX_LINES | CATALOGUES
    }
    assert over == {}, f"over {MAX_LINES} lines: {over}"


def test_the_allow_list_of_long_modules_only_shrinks() -> None:
    """An allowed module that is gone or now short leaves the list, so it cannot regrow."""
    short = {
        name
        for name in OVER_MAX_LINES
        if not (PACKAGE / name).exists() or _line_count(PACKAGE / name) <= MAX_LINES
    }
    assert short == set(), f"remove from OVER_MAX_LINES: {sorted(short)}"


def test_no_module_imports_the_package_itself() -> None:
    """`durable/__init__.py` imports the public surface: a module inside the package that
    imported `durable` (or a name of it that is not a module) would close a circle
    through it."""
    offenders = []
    for module, path in MODULES.items():
        if module == "durable":
            continue
        for node in _all_imports(_tree(path)):
            if isinstance(node, ast.Import) and any(a.name == "durable" for a in node.names):
                offenders.append(module)
            if isinstance(node, ast.ImportFrom) and node.module == "durable" and not node.level:
                if any(f"durable.{a.name}" not in MODULES for a in node.names):
                    offenders.append(module)
    assert offenders == []


# The engine's parts: what makes up an Engine beside the claims, and how a run is hosted.
ENGINE_PARTS = {
    "durable._host.engine",
    "durable._host.services",
    "durable._host.runner",
    "durable._host.async_host",
    "durable._client.client",
}


def _reaches_engine_parts(module: str, tree: ast.Module) -> list[str]:
    """What `module` imports of the engine's parts, and where it reaches for them through
    an engine (`engine.runner`, `self.engine.client`, ...)."""
    found = sorted(_imported_modules(module, tree) & ENGINE_PARTS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in {"runner", "client", "engine"}:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("module", ["durable._host.recovery", "durable._host.claims"])
def test_the_worker_loop_knows_only_its_parts(module: str) -> None:
    """The worker loop, the keeper and the heartbeat are given what they use (claims, a
    launcher, slots, a subscription: `WorkerParts`), made by the engine: they import none
    of the engine's parts and never reach through an engine for its runner or client. The
    claims they are given return what they claim, and know no more of the engine."""
    assert _reaches_engine_parts(module, _tree(MODULES[module])) == []


def test_the_worker_loop_check_sees_a_reach() -> None:
    source = "def f(engine):\n    engine.runner.dequeue(1)\n"
    assert _reaches_engine_parts("durable._host.recovery", ast.parse(source)) == ["line 2: .runner"]
    source = "from durable._host.runner import Runner\n"
    assert _reaches_engine_parts("durable._host.recovery", ast.parse(source)) == [
        "durable._host.runner"
    ]


def _routes_by_name(tree: ast.Module) -> list[int]:
    """Lines that compare an operation's statement name with a string (`op.name == "x"`)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "name"
        and any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in node.comparators)
    ]


def test_the_drivers_route_by_operation_not_by_statement_name() -> None:
    """A write the sync driver commits together with other runs' (a step record, an
    outcome) is an operation of its own (RecordStep, Finish): renaming a statement cannot
    silently take it out of the group commit."""
    for name in ("_run/driver.py", "_run/driver_async.py"):
        assert _routes_by_name(_tree(PACKAGE / name)) == [], name
    assert _routes_by_name(ast.parse('if op.name == "record_step":\n    pass\n')) == [1]
