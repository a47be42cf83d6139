"""From one PostgreSQL server to Citus, following docs/scaling.md's runbook word for word.

A deployment runs on one plain PostgreSQL server (no Citus loaded): a `durable worker` with
workflows running, sleeping, waiting for a message and waiting for an approval, and a
`@transaction` workflow's application table (`marks`). Beside it, two worker nodes are
built (Citus loaded, the database created with the extension). Then the runbook's move:

1. stop the workers (SIGTERM, wait for them to exit);
2. make the server the coordinator: `shared_preload_libraries = 'citus'`, restart,
   `CREATE EXTENSION citus`, `citus_set_coordinator_host`, `citus_add_node` per node,
   the shard count for the tables about to be distributed;
3. `durable migrate --citus`;
4. colocate the application's table with `durable.workflows`;
5. start the workers again.

Every workflow started before finishes after, each step recorded once in the world (the
`world` table, written outside durable), each `@transaction` row once (a unique key).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

import durable
from tests import citus
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for
from tests.apps import counter_app

pytestmark = pytest.mark.citus

DB = "shop"
SLOW = [f"slow{i}" for i in range(3)]
NAPS = [f"nap{i}" for i in range(2)]
# Long enough that the naps are still asleep when the worker is stopped, however slow the
# setup of the worker nodes beside it (a nap that woke before would never be seen
# suspended); they end after the move.
NAP_SECONDS = 30.0
WAITS = [f"wait{i}" for i in range(2)]
LOADS = [f"load{i}" for i in range(4)]  # started during the stop: @transaction into `marks`
LOAD_STEPS = 6  # every other one a @transaction (counter_app.load)
GATE = "gate"
STEPS = 40  # of 0.2s each: still running when the worker is stopped


@pytest.fixture
def one_server() -> Iterator[citus.CitusCluster]:
    """A plain PostgreSQL server (the coordinator to be) and two worker nodes beside it."""
    try:
        citus.ensure_installed()
    except citus.Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    with citus.citus_cluster(plain_coordinator=True) as cluster:
        yield cluster


def status_of(url: str, workflow_id: str) -> str:
    return str(
        scalar(url, "SELECT status FROM durable.workflows WHERE workflow_id = %s", workflow_id)
    )


def steps_of(url: str, workflow_id: str) -> int:
    return int(
        str(scalar(url, "SELECT count(*) FROM durable.steps WHERE workflow_id = %s", workflow_id))
    )


def durable_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=180
    )


def test_runbook_moves_one_server_with_running_and_waiting_workflows_onto_citus(
    one_server: citus.CitusCluster, subprocess_env: dict[str, str]
) -> None:
    cluster = one_server
    assert cluster.coordinator is not None
    server = cluster.coordinator
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
        loaded = conn.execute("SHOW shared_preload_libraries").fetchone()
    assert loaded is not None and "citus" not in str(loaded[0]), "a plain server to start from"
    url = server.url(DB)

    # The deployment on one server.
    with durable.Client(url, migrate=True):
        pass
    with client(url) as engine:
        for w in SLOW:
            engine.submit(counter_app.slow, w, STEPS, 0.2, workflow_id=w)
        for w in NAPS:
            engine.submit(counter_app.napper, w, NAP_SECONDS, workflow_id=w)
        for w in WAITS:
            engine.submit(counter_app.booked_wait, w, workflow_id=w)
        engine.submit(counter_app.big_refund, 5000, None, workflow_id=GATE)
    worker = start_worker(subprocess_env, url, lease=2.0, concurrency=8, grace=1.0)
    try:
        # Beforehand, beside it: the worker nodes, each with the database and the
        # extension (step 1 of the runbook), and the plan (step 2).
        for node in cluster.workers:
            with psycopg.connect(node.url(), autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
            with psycopg.connect(node.url(DB), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION citus")
        plan = durable_cli("migrate", "--citus", "--dry-run")
        assert plan.returncode == 0, plan.stderr
        assert "create_distributed_table" in plan.stdout
        wait_for(
            lambda: all(status_of(url, w) == "SUCCESS" or steps_of(url, w) >= 2 for w in SLOW),
            timeout=60,
            what="the slow workflows under way",
        )
        wait_for(
            lambda: all(status_of(url, w) == "SUSPENDED" for w in [*NAPS, *WAITS, GATE]),
            timeout=60,
            what="the others suspended (sleep, recv, approval) while the slow ones run",
        )
        # The move. 1. Stop the workers.
        stop_worker(worker, timeout=60)
    finally:
        stop_worker(worker)
    assert any(status_of(url, w) != "SUCCESS" for w in SLOW), "some work is left to move"
    # Work started during the stop waits for the workers: @transaction steps into `marks`.
    with client(url) as engine:
        for w in LOADS:
            engine.submit(counter_app.load, w, LOAD_STEPS, workflow_id=w)

    # 2. The server becomes the coordinator: Citus loaded, a restart, the extension in the
    # database, the worker nodes added, the shard count of the tables to distribute.
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'citus'")
    cluster.restart_node(server)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION citus")
        conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", [server.port])
        for node in cluster.workers:
            conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [node.port])
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET citus.shard_count = 4").format(sql.Identifier(DB))
        )

    # 3. Distribute durable's tables.
    done = durable_cli("migrate", "--citus", "--database-url", url)
    assert done.returncode == 0, done.stderr
    assert "distributed" in done.stdout

    # 4. Colocate the application's table with durable.workflows.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT create_distributed_table('marks', 'workflow_id',"
            " colocate_with => 'durable.workflows')"
        )
        rows = conn.execute(
            "SELECT logicalrelid::text, colocationid FROM pg_dist_partition"
            " WHERE logicalrelid IN ('durable.workflows'::regclass, 'marks'::regclass)"
        ).fetchall()
    assert len(rows) == 2 and rows[0][1] == rows[1][1], rows

    # 5. Start the workers again; the waiting workflows get what they wait for.
    worker = start_worker({**subprocess_env, "DURABLE_LISTEN": "0"}, url, lease=2.0, concurrency=8)
    try:
        with client(url) as engine:
            for w in WAITS:
                engine.send(w, "yes", topic="go")
            wait_for(
                lambda: bool(engine.list_approvals(workflow_id=GATE)),
                timeout=60,
                what="the approval gate",
            )
            engine.decide(GATE, "refund-over-limit", True, decided_by="ops")
            everyone = [*SLOW, *NAPS, *WAITS, *LOADS, GATE]
            wait_for(
                lambda: all(status_of(url, w) == "SUCCESS" for w in everyone),
                timeout=120,
                what="every workflow started before the move",
            )
    finally:
        stop_worker(worker)

    world = counter_app_world(url)
    expected = {(w, f"s{i}") for w in SLOW for i in range(STEPS)}
    expected |= {(w, label) for w in NAPS for label in ("before", "after")}
    expected |= {(w, "ship") for w in WAITS}
    expected |= {("big", "before-gate")}
    assert set(world) == expected, "no step lost"
    runs = collections.Counter(world)
    twice = {key: n for key, n in runs.items() if n > 1}
    # Only a step still under way when the stop's grace ended (a plain step, at least once,
    # as after a crash) may run again after the move; no other does.
    assert all(key[0] in SLOW and n == 2 for key, n in twice.items()), twice
    assert len({w for w, _ in twice}) == len(twice), twice
    print(f"\nsteps cut by the stop and run again after the move: {sorted(twice)}")
    # The @transaction steps wrote their rows once each, on their workflows' shards.
    with psycopg.connect(url) as conn:
        marks = conn.execute("SELECT workflow_id, i FROM marks").fetchall()
    assert sorted(marks) == sorted((w, i) for w in LOADS for i in range(0, LOAD_STEPS, 2))
    assert scalar(url, "SELECT count(*) FROM durable.workflows WHERE status <> 'SUCCESS'") == 0


def counter_app_world(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT workflow_id, what FROM world ORDER BY id").fetchall()
    return [(r[0], r[1]) for r in rows]
