"""A Citus worker node that is a primary with a synchronous standby (pg_auto_failover) is
killed under load; the monitor promotes the standby and the coordinator is pointed at it
with `citus_update_node`, as docs/scaling.md's "High availability per node" says.

The cluster: a coordinator, one plain worker node, and a worker node that is a
pg_auto_failover pair (tests/ha.py, Citus loaded on both). Two `durable worker` processes
run counter_app.load workflows: every other step a @transaction inserting (workflow_id, i)
into `marks`, colocated with durable's tables, UNIQUE (workflow_id, i): a step run twice
would fail there, one lost would be missing. The pair's primary is SIGKILLed with its
supervisor after a third of the steps. Every workflow finishes, none in ERROR, every
@transaction row there once: nothing committed on the dead primary was lost.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import durable
from tests import citus, ha
from tests.acceptance.workers import client, start_worker, stop_worker, wait_for
from tests.apps import counter_app

# About a minute and a half: the long lane (DURABLE_TEST_LONG=1, CONTRIBUTING.md).
pytestmark = [pytest.mark.citus, pytest.mark.long]

N_WORKFLOWS = 120
N_STEPS = 6  # 3 marks (transactions) and 3 pure steps each


def _count(url: str, query: str, params: list[object] | None = None) -> int | None:
    """One number from the coordinator, or None while the cluster cannot answer."""
    try:
        with psycopg.connect(url, connect_timeout=5, options="-c statement_timeout=10s") as conn:
            row = conn.execute(query, params or []).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else int(row[0])


def test_a_worker_node_with_a_standby_killed_under_load(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    try:
        citus.ensure_installed()
        ha.ensure_installed()
    except (citus.Unavailable, ha.Unavailable) as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    preload = {k: v for k, v in citus.SETTINGS.items() if k in citus.CITUS_ONLY}
    # `CREATE EXTENSION citus` turns SSL on with a certificate of its own on the node where
    # it runs, and Citus connects to nodes with sslmode=require: a standby made before (or
    # by a base backup, which takes neither the setting nor the certificate along) would be
    # refused once promoted. Here the nodes prefer SSL instead of requiring it.
    conninfo = "'sslmode=prefer'"
    preload["citus.node_conninfo"] = conninfo
    with (
        citus.citus_cluster(n_workers=1) as cluster,
        ha.ha_cluster(settings=preload) as pair,
    ):
        assert cluster.coordinator is not None
        db = pair.dbname
        for node in cluster.nodes:
            with psycopg.connect(node.url(), autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
                conn.execute(f"ALTER SYSTEM SET citus.node_conninfo = {conninfo}")
                conn.execute("SELECT pg_reload_conf()")
        primary = pair.primary()
        for node_url in [n.url(db) for n in cluster.nodes] + [pair.node_url(primary)]:
            with psycopg.connect(node_url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION citus")
        url = cluster.coordinator.url(db)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "SELECT citus_set_coordinator_host('127.0.0.1', %s)", [cluster.coordinator.port]
            )
            conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [cluster.workers[0].port])
            conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [primary.port])
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET citus.shard_count = 4").format(sql.Identifier(db))
            )
        with durable.Client(url, migrate=True) as setup:
            setup.distribute_citus()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE marks (workflow_id text NOT NULL, i int NOT NULL,"
                " at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (workflow_id, i))"
            )
            conn.execute(
                "SELECT create_distributed_table('marks', 'workflow_id',"
                " colocate_with => 'durable.workflows')"
            )
        ids = [f"F{i}" for i in range(N_WORKFLOWS)]
        on_pair = _count(
            url,
            "SELECT count(*) FROM unnest(%s::text[]) AS w JOIN pg_dist_shard_placement p"
            " ON p.shardid = get_shard_id_for_distribution_column('durable.workflows', w)"
            " WHERE p.nodeport = %s",
            [ids, primary.port],
        )
        assert on_pair and on_pair < N_WORKFLOWS, "the workflows' shards are on both nodes"
        with client(url) as engine:
            for w in ids:
                engine.submit(counter_app.load, w, N_STEPS, workflow_id=w)
        log = str(tmp_path / "worker")
        workers = [
            start_worker(subprocess_env, url, lease=2.0, concurrency=8, log=f"{log}.{i}")
            for i in range(2)
        ]
        total = N_WORKFLOWS * N_STEPS // 2
        try:
            wait_for(
                lambda: (_count(url, "SELECT count(*) FROM marks") or 0) >= total // 3,
                timeout=180,
                what="a third of the steps",
            )
            old = pair.kill_primary()
            killed_at = time.monotonic()
            new = pair.wait_promoted()
            promoted = time.monotonic() - killed_at
            # The operator's (or pg_auto_failover's) part: the node's new address.
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "SELECT citus_update_node(nodeid, '127.0.0.1', %s) FROM pg_dist_node"
                    " WHERE nodeport = %s",
                    [new.port, old.port],
                )
            updated = time.monotonic() - killed_at
            wait_for(
                lambda: (
                    _count(url, "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'")
                    == N_WORKFLOWS
                ),
                timeout=240,
                what="every workflow to finish",
            )
            finished = time.monotonic() - killed_at
            dead = [
                (i, proc.poll(), Path(f"{log}.{i}").read_text(errors="replace")[-3000:])
                for i, proc in enumerate(workers)
                if proc.poll() is not None
            ]
            assert not dead, f"the workers must survive: {dead}"
        finally:
            for proc in workers:
                stop_worker(proc)

        with psycopg.connect(url) as conn:
            statuses = dict(
                conn.execute("SELECT status, count(*) FROM durable.workflows GROUP BY 1").fetchall()
            )
            marks = conn.execute("SELECT count(*) FROM marks").fetchone()
            per_workflow = conn.execute(
                "SELECT count(*) FROM (SELECT workflow_id FROM marks GROUP BY 1"
                " HAVING count(*) = %s) AS full_runs",
                [N_STEPS // 2],
            ).fetchone()
            steps = conn.execute("SELECT count(*) FROM durable.steps").fetchone()
        assert statuses == {"SUCCESS": N_WORKFLOWS}, statuses
        assert marks is not None and marks[0] == total
        assert per_workflow is not None and per_workflow[0] == N_WORKFLOWS
        assert steps is not None and steps[0] == N_WORKFLOWS * N_STEPS
        print(
            f"\ncitus node failover: {on_pair} of {N_WORKFLOWS} workflows on the pair; standby"
            f" promoted {promoted:.1f}s after the kill, the coordinator pointed at it at"
            f" {updated:.1f}s, every workflow finished at {finished:.1f}s"
        )
