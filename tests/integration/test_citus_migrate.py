"""`durable migrate --citus` on a real Citus cluster, and an engine starting on what it made.

The cluster is tests/citus.py's (a coordinator and two workers); each test has a database of
its own on it.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys

import psycopg
import pytest

import durable
from durable._io import citus as _citus
from durable._io import migrate as _migrate

pytestmark = pytest.mark.citus


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=120
    )


def distributed(url: str) -> dict[str, str]:
    """{table: 'd' (distributed) or 'n' (reference)} of durable's tables."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT logicalrelid::regclass::text, partmethod FROM pg_dist_partition"
            " WHERE logicalrelid::regclass::text LIKE 'durable.%'"
        ).fetchall()
    return {name.removeprefix("durable."): method for name, method in rows}


def test_migrate_on_a_fresh_cluster_database(citus_bare_url: str) -> None:
    # The claims mode was looked up with a cast of 'durable.workflows' to regclass, which
    # fails while the schema does not exist yet.
    done = cli("migrate", "--database-url", citus_bare_url)
    assert done.returncode == 0, done.stderr
    assert "applied migrations" in done.stdout
    assert distributed(citus_bare_url) == {}


def test_migrate_citus_on_a_fresh_cluster_database_distributes_every_table(
    citus_bare_url: str,
) -> None:
    done = cli("migrate", "--citus", "--database-url", citus_bare_url)
    assert done.returncode == 0, done.stderr
    tables = distributed(citus_bare_url)
    expected = {name: "h" for name in [*_citus.BY_WORKFLOW, *_citus.BY_OWN_KEY]}
    expected |= {name: "n" for name in _citus.REFERENCE}
    assert tables == expected
    assert f"distributed {len(expected)} tables" in done.stdout
    again = cli("migrate", "--citus", "--database-url", citus_bare_url)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout and "distributed 0 tables" in again.stdout


def test_an_engine_starts_on_the_distributed_schema_on_its_clock(citus_url: str) -> None:
    # Registering the executor was an upsert whose DO UPDATE SET called current_time(),
    # which Citus refuses on a distributed (or reference) table, and current_time() itself
    # was a COALESCE, which Citus refuses around a function that is not IMMUTABLE: 0A000
    # as the engine started.
    clock = durable.FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    reg = durable.Registry()
    with durable.Engine(citus_url, registry=reg, executor_id="e-1", clock=clock) as engine:
        clock.advance(3600)
        # The same executor registering again (a restart): the upsert's DO UPDATE.
        engine.client.db.execute(
            "upsert_executor",
            {
                "executor_id": "e-1",
                "hostname": "h",
                "pid": 1,
                "capabilities": "[]",
                "incarnation": engine.ownership.incarnation,
                "host_key": "",
                "pid_start": None,
            },
        )
        row = engine.client.db.fetch_one("get_executor", {"executor_id": "e-1"})
    # Its heartbeat is on the engine's clock (the server's own time is years away).
    assert row is not None and row["hostname"] == "h"
    assert abs(float(row["heartbeat_age"])) < 60, row


def test_the_latest_migration_applies_to_a_schema_distributed_before_it(
    citus_bare_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade on a cluster: a schema migrated and distributed by the previous release,
    then `durable migrate --citus` of this one (its new migration runs on distributed
    tables), then a workflow whose claim uses what the migration made."""
    shipped = _migrate.available()
    monkeypatch.setattr(_migrate, "available", lambda: shipped[:-1])
    with durable.Client(citus_bare_url, migrate=True):
        pass
    with psycopg.connect(citus_bare_url, autocommit=True) as conn:
        for table, statement in _citus.plan():
            if table is not None:
                found = conn.execute("SELECT to_regclass(%s)", [table]).fetchone()
                if found is None or found[0] is None:
                    continue  # made by a later migration
            name = re.search(r"create_distributed_function\('(.*?)'[,)]", statement)
            if name is not None:
                found = conn.execute("SELECT to_regprocedure(%s)", [name.group(1)]).fetchone()
                if found is None or found[0] is None:
                    continue  # made by a later migration
            made = re.search(r"create_(?:distributed|reference)_table\('(.*?)'", statement)
            if made is not None:
                found = conn.execute("SELECT to_regclass(%s)", [made.group(1)]).fetchone()
                if found is None or found[0] is None:
                    continue  # made by a later migration
            conn.execute(statement.encode())
    monkeypatch.undo()
    done = cli("migrate", "--citus", "--database-url", citus_bare_url)
    assert done.returncode == 0, done.stderr
    assert f"applied migrations: [{shipped[-1][0]}]" in done.stdout

    reg = durable.Registry()

    @durable.workflow(registry=reg, timeout=60)
    def answer() -> int:
        return 42

    with durable.Client(citus_bare_url) as client:
        handle = client.submit(answer)  # claimed by the engine's worker
        with durable.Engine(citus_bare_url, registry=reg, worker=True, poll_interval=0.1):
            assert handle.result(timeout=30) == 42
