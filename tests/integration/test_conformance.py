"""The two drivers conform: every protocol generator, run by the sync driver
(durable/_run/driver.py) and by the async one (durable/_run/driver_async.py), asks for the same
operations and leaves the same world.

The workload (tests/integration/conformance_app.py) is one workflow per part of the
protocol (steps, transactions, effects, children, messages and events, waits, streams,
budgets, patches and the conversation state), written with plain `def` and with
`async def` under the same names. Each version runs in a database of its own; then the
test compares, workflow by workflow, what each returned or raised, the list of operations
the protocol's generators yielded to the driver (recorded by wrapping every generator the
drivers are handed), and the rows written: the journal, the effect ledger, the messages,
events, streams, approvals, budgets and charges, and the application's own rows.

This is where the `[sync]`/`[async]` twins of the real-process acceptance tests are
proven to behave alike; each acceptance scenario keeps one real process.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from durable._run import children as _children
from durable._run import driver as _driver
from durable._run import driver_async as _driver_async
from durable._run import patches as _patches
from durable._run import state as _state
from durable._run import waits as _waits
from durable.testing import TemplateDatabases
from tests import citus
from tests.conftest import ON_CITUS
from tests.integration import conformance_app

# The tests' own reads, at READ COMMITTED whatever the default (under
# DURABLE_TEST_ISOLATION=serializable even a read can be refused with 40001).
READ_COMMITTED = "-c default_transaction_isolation=read\\ committed"

# Modules that call a driver by a name of their own.
DRIVES = ("drive", "drive_async", "drive_in_step", "drive_in_step_async")


def callers() -> list[ModuleType]:
    """Every loaded durable module that calls a driver by a name of its own (found, not
    listed: a module that starts calling a driver is recorded without anyone adding it)."""
    drivers = {getattr(m, d, None) for m in (_driver, _driver_async) for d in DRIVES} - {None}
    found = [
        module
        for name, module in sorted(sys.modules.items())
        if name.startswith("durable.") and any(getattr(module, d, 0) in drivers for d in DRIVES)
    ]
    for module in (_driver, _driver_async, _children, _patches, _state, _waits):
        assert module in found, module
    return found


# Columns that differ between any two runs (times, owners, incarnations, code versions).
VOLATILE = {
    "owner",
    "epoch",
    "incarnation",
    "trace_context",
    "version",
    "lease_expires_at",
    "applied_in",
    "audit_id",
}
TABLES = [
    "workflows",
    "steps",
    "effects",
    "messages",
    "events",
    "streams",
    "approvals",
    "budgets",
    "charges",
    "late_charges",
]


def describe(op: Any) -> str:
    """An operation as the driver sees it: its kind and what it names (never a value)."""
    kind = type(op).__name__
    name = getattr(op, "name", None)
    if kind in ("Execute", "AppExecute") and name:
        return f"{kind} {name}"
    if kind == "WriteSteps":
        return f"WriteSteps {len(op.rows)}{' +finish' if op.finish else ''}"
    if kind in ("Call", "AppCall"):
        scope = getattr(op, "scope", None)
        step = getattr(scope, "name", None) or getattr(scope, "step_name", None)
        return f"{kind} {step or ('body' if getattr(op, 'body', False) else '')}".rstrip()
    if kind == "AppEnd":
        return f"AppEnd commit={op.commit}"
    return kind


# Operations that a race between a run and its engine's own rounds decides, with the same
# world either way: a gate whose timeout has passed is decided by its default by the
# engine's round (expire_approvals, which then wakes the run) or, when the resumed run
# reads it first, by the run itself (expire_approval). Which comes first is timing.
RACED = frozenset({"Execute expire_approval"})


def unraced(ops: list[str]) -> list[str]:
    """`ops` without the operations a race decides (RACED)."""
    return [op for op in ops if op not in RACED]


def recorded(gen: Generator[Any, Any, Any], log: list[str]) -> Generator[Any, Any, Any]:
    """`gen`, passing every operation on unchanged and noting it in `log`."""
    label = getattr(gen, "__name__", "?")
    log.append(f"> {label}")
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            log.append(f"< {label}")
            return stop.value
        except BaseException as exc:
            log.append(f"< {label} {type(exc).__name__}")
            raise
        log.append(describe(op))
        try:
            value, error = (yield op), None
        except BaseException as exc:
            value, error = None, exc


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    """Operations each run's generators yield, by workflow id."""
    logs: dict[str, list[str]] = {}

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def log_of(run: Any) -> list[str]:
            return logs.setdefault(str(run.workflow_id), [])

        if original.__name__.endswith("_async"):

            async def driven_async(run: Any, gen: Any) -> Any:
                return await original(run, recorded(gen, log_of(run)))

            return driven_async

        def driven(run: Any, gen: Any) -> Any:
            return original(run, recorded(gen, log_of(run)))

        return driven

    drivers = {getattr(m, d, None) for m in (_driver, _driver_async) for d in DRIVES} - {None}
    for module in callers():
        for name in DRIVES:
            if getattr(module, name, None) in drivers:
                monkeypatch.setattr(module, name, wrap(getattr(module, name)))
    yield logs


def _plain(value: Any) -> Any:
    """A column's value with what differs between runs taken out."""
    if isinstance(value, str):
        value = re.sub(r"@[0-9a-f-]{8,}", "@<incarnation>", value)
        value = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:\d\d)?", "<time>", value)
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, dict):
            decoded.pop("traceback", None)
            decoded.pop("tb", None)
        return json.dumps(decoded, sort_keys=True)
    return value


def world(url: str) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(url, options=READ_COMMITTED) as conn:
        for table in TABLES:
            cur = conn.execute(f"SELECT * FROM durable.{table}")
            assert cur.description is not None
            keep = [
                i
                for i, col in enumerate(cur.description)
                if col.name not in VOLATILE and col.type_code != 1184  # timestamptz
            ]
            names = [cur.description[i].name for i in keep]
            rows = [tuple((names[j], _plain(r[i])) for j, i in enumerate(keep)) for r in cur]
            out[table] = sorted(rows, key=repr)
        for table in ("conf_rows", "conf_vendor"):
            rows = conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            out[table] = [tuple(r) for r in rows]
    return out


def run_workload(url: str, asynchronous: bool) -> dict[str, Any]:
    conformance_app.setup(url)
    reg, workflows = conformance_app.build(asynchronous, url)
    outcomes: dict[str, Any] = {}

    def outcome(handle: durable.WorkflowHandle) -> Any:
        try:
            return handle.result(timeout=60)
        except errors.WorkflowFailedError as exc:
            return ("error", exc.error_type.rpartition(".")[2])

    with durable.Engine(url, registry=reg, worker=True, poll_interval=0.05) as engine:
        for name, (args, _) in conformance_app.WORKLOAD.items():
            outcomes[name] = outcome(engine.start(workflows[name], *args, workflow_id=name))
        for info in engine.client.list_workflows():  # the children
            if info.workflow_id not in outcomes:
                outcomes[info.workflow_id] = outcome(engine.client.retrieve(info.workflow_id))
    return outcomes


@pytest.fixture
def second_database(
    request: pytest.FixtureRequest, pg_databases: TemplateDatabases
) -> Iterator[str]:
    """A second fresh database, of the same kind as `database_url` (on the Citus cluster
    under DURABLE_TEST_ON_CITUS=1)."""
    if ON_CITUS:
        cluster: citus.CitusCluster = request.getfixturevalue("citus_cluster")
        url = cluster.create_database()
        with durable.Client(url, migrate=True) as client:
            client.distribute_citus()
        yield url
        cluster.drop_database(url)
        return
    url = pg_databases.create()
    yield url
    pg_databases.drop(url)


def test_both_drivers_ask_the_same_operations_and_leave_the_same_world(
    database_url: str, second_database: str, record: dict[str, list[str]]
) -> None:
    outcomes = run_workload(database_url, asynchronous=False)
    sync_ops = dict(record)
    record.clear()
    async_outcomes = run_workload(second_database, asynchronous=True)
    async_ops = dict(record)

    # Each workflow did what it is written to do, under both drivers alike.
    expected = {name: want for name, (_, want) in conformance_app.WORKLOAD.items()}
    expected.update(conformance_app.CHILDREN)
    assert outcomes == expected
    assert async_outcomes == expected
    # The same operations, in the same order, for every run (children included), but for
    # the ones a race decides (RACED).
    assert sorted(sync_ops) == sorted(async_ops)
    for workflow_id in sync_ops:
        assert unraced(async_ops[workflow_id]) == unraced(sync_ops[workflow_id]), workflow_id
    # The same rows: journal, ledgers, waits, streams, budgets, the application's own.
    sync_world, async_world = world(database_url), world(second_database)
    for table in sync_world:
        assert async_world[table] == sync_world[table], table
    assert sync_world["steps"] and sync_world["effects"] and sync_world["messages"]
