"""The sync modules listed in `tools/async_to_sync.py`'s PAIRS (the run I/O
`durable/_io/runio.py`, the host of a workflow's life `durable/_run/host_sync.py`, the in-workflow
API's `_run/waits.py`, `_run/state.py`, ...) are generated from their async sources by that script,
and committed. These tests fail when a committed file is not what the generator makes of
its source now (someone edited one and not the other), when a hand-written twin creeps back
(into the SystemDB, or a perform of lifecycle operations outside the host), and when a pair
of durable/_run/acompat.py stops behaving alike.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    path = ROOT / "tools" / "async_to_sync.py"
    spec = importlib.util.spec_from_file_location("async_to_sync", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("async_to_sync", module)
    spec.loader.exec_module(module)
    return module


def test_every_generated_module_is_what_its_async_source_generates() -> None:
    gen = _generator()
    for source, target in gen.PAIRS:
        committed = (ROOT / target).read_text("utf-8")
        assert committed == gen.generate(source, target), (
            f"{target} differs from what {source} generates: edit {source} "
            f"(never {target}) and run `{gen.COMMAND}`"
        )
    assert gen.stale() == []


def test_each_generated_file_says_so_and_how_to_make_it() -> None:
    gen = _generator()
    for source, target in gen.PAIRS:
        head = (ROOT / target).read_text("utf-8").splitlines()[:3]
        assert f"Generated from {source.as_posix()}" in head[0]
        assert gen.COMMAND in head[1]


def test_every_file_that_says_it_is_generated_is_in_the_list() -> None:
    """A generated module left out of PAIRS would never be checked again."""
    gen = _generator()
    listed = {target.as_posix() for _, target in gen.PAIRS}
    said = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "durable").rglob("*.py")
        if path.read_text("utf-8").startswith("# Generated from ")
    }
    assert said == listed


def test_async_blocks_keep_the_sync_branch_only() -> None:
    gen = _generator()
    source = (
        "async def f() -> int:\n"
        "    if True:  # ASYNC\n"
        "        x = await g_async()\n"
        "\n"
        "        y = 1\n"
        "    else:\n"
        "        x = g()\n"
        "        if x:\n"
        "            y = 2\n"
        "    if True:  # ASYNC\n"
        "        await h_async()\n"
        "    return x + y\n"
    )
    assert gen.resolve_blocks(source) == (
        "async def f() -> int:\n    x = g()\n    if x:\n        y = 2\n    return x + y\n"
    )
    assert gen.translate(source).startswith("def f() -> int:\n    x = g()\n")
    # A plain `if True:` (no marker) is left alone.
    assert gen.resolve_blocks("if True:\n    a()\nelse:\n    b()\n").count("a()") == 1


def test_the_compatibility_names_pair_up() -> None:
    """Each async name of durable/_run/acompat.py has the sync twin the translation maps it to."""
    gen = _generator()
    import durable._run.acompat as compat

    for name in dir(compat):
        if name.endswith("_async") or name.startswith("Async"):
            assert hasattr(compat, gen._rename(name)), name


def test_the_translation() -> None:
    gen = _generator()
    source = (
        "import asyncio\n"
        "import sqlalchemy.ext.asyncio\n"
        "async def run_on_async(c: psycopg.AsyncConnection[Any],"
        " s: sqlalchemy.ext.asyncio.AsyncConnection) -> None:\n"
        "    async with c.transaction():  # run_on_async stays in a comment\n"
        "        await c.execute(b'x')\n"
        "    await asyncio.sleep(1)\n"
        "    x = (await s.get_raw_connection()).driver_connection\n"
    )
    assert gen.translate(source) == (
        "import time\n"
        "import sqlalchemy\n"
        "def run_on(c: psycopg.Connection[Any],"
        " s: sqlalchemy.Connection) -> None:\n"
        "    with c.transaction():  # run_on_async stays in a comment\n"
        "        c.execute(b'x')\n"
        "    time.sleep(1)\n"
        "    x = (s.get_raw_connection()).driver_connection\n"
    )
    # The application transaction: a context manager entered and left by hand.
    source = (
        "async def begin(self, t: sqlalchemy.ext.asyncio.AsyncTransaction) -> None:\n"
        "    self.conn = await self._cm.__aenter__()\n"
        "    await self._cm.__aexit__(None, None, None)\n"
    )
    assert gen.translate(source) == (
        "def begin(self, t: sqlalchemy.Transaction) -> None:\n"
        "    self.conn = self._cm.__enter__()\n"
        "    self._cm.__exit__(None, None, None)\n"
    )


def test_the_systemdb_writes_no_twin_of_the_generated_io_by_hand() -> None:
    """Its methods come from RunIO and AsyncRunIO; a hand-written body of the same name in
    _io/systemdb.py would shadow one side and let the two drift apart again."""
    gen = _generator()
    tree = ast.parse((ROOT / gen.SOURCE).read_text("utf-8"))
    (io,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AsyncRunIO"]
    async_names = {n.name for n in io.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)}
    names = async_names | {gen._rename(n) for n in async_names}
    systemdb = ast.parse((ROOT / "durable" / "_io" / "systemdb.py").read_text("utf-8"))
    written = {
        f.name
        for c in systemdb.body
        if isinstance(c, ast.ClassDef) and c.name == "SystemDB"
        for f in c.body
        if isinstance(f, ast.AsyncFunctionDef | ast.FunctionDef)
    }
    assert names, "AsyncRunIO has no methods?"
    assert not names & written


def _perform_cases(module: Path, cls: str) -> set[str]:
    """The lifecycle operations `cls.perform` in `module` matches on, by class name."""
    tree = ast.parse((ROOT / module).read_text("utf-8"))
    (host,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (perform,) = [
        n
        for n in host.body
        if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef) and n.name == "perform"
    ]
    return {
        node.cls.attr
        for node in ast.walk(perform)
        if isinstance(node, ast.MatchClass) and isinstance(node.cls, ast.Attribute)
    }


def test_one_host_performs_every_lifecycle_operation_on_both_sides() -> None:
    """The life around a run is performed by one host, written once (its sync twin
    generated): each operation of _lifecycle has its arm in the host's perform, on both
    sides, and no other module performs lifecycle operations with a perform of its own."""
    gen = _generator()
    import typing

    from durable._core import lifecycle

    ops = {op.__name__ for op in typing.get_args(lifecycle.Op)}
    assert len(ops) == 13
    pair = (Path("durable/_run/host_async.py"), Path("durable/_run/host_sync.py"))
    assert pair in gen.PAIRS
    assert _perform_cases(pair[0], "AsyncLifeHost") == ops
    assert _perform_cases(pair[1], "LifeHost") == ops
    others = {
        path.relative_to(ROOT).as_posix(): node.lineno
        for path in (ROOT / "durable").rglob("*.py")
        if path.relative_to(ROOT).as_posix()
        not in {"durable/_run/host_async.py", "durable/_run/host_sync.py"}
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == "perform"
    }
    assert others == {}, f"a perform outside the host: {others}"


def test_the_compatibility_pairs_behave_the_same() -> None:
    """wait and waitable, on either side: a run's end is waited for without raising what
    it raised, and a time limit is kept."""
    import asyncio
    import concurrent.futures

    from durable._run import acompat as compat

    failed: concurrent.futures.Future[object] = concurrent.futures.Future()
    failed.set_exception(SystemExit(3))
    pending: concurrent.futures.Future[object] = concurrent.futures.Future()
    assert compat.wait(failed, None) is True
    assert compat.wait(pending, 0.01) is False
    assert compat.waitable(failed) is failed

    async def on_a_loop() -> tuple[bool, bool]:
        ended = compat.waitable_async(failed)
        waiting = compat.waitable_async(pending)
        result = await compat.wait_async(ended, None), await compat.wait_async(waiting, 0.01)
        ended.exception()  # (retrieved)
        return result

    assert asyncio.run(on_a_loop()) == (True, False)
    pending.cancel()


def test_module_level_blocks_keep_each_sides_imports() -> None:
    """Imports only one side uses sit in a module-level block, so neither file imports
    what it does not use; the host's names map to their sync twins."""
    gen = _generator()
    source = (
        "from durable._run.acompat import AsyncFuture, wait_async\n"
        "if True:  # ASYNC\n"
        "    from collections.abc import Callable\n"
        "else:\n"
        "    import contextvars\n"
        "class AsyncLifeHost:\n"
        "    waiter: AsyncFuture[int]\n"
    )
    assert gen.translate(source) == (
        "from durable._run.acompat import Future, wait\n"
        "import contextvars\n"
        "class LifeHost:\n"
        "    waiter: Future[int]\n"
    )
