"""A Citus worker node fails under load: SIGKILL its postmaster while 200 workflows run on
two `durable worker` processes, then start it again.

The workflows are counter_app.load: every other step is a @transaction inserting
(workflow_id, i) into `marks`, distributed by workflow id and colocated with durable's
tables (so a step's row and its journal row commit on one shard), UNIQUE (workflow_id, i):
a step run twice would fail there, a step lost would be missing. Every workflow whose
shard is on the surviving node finishes while the other is down (the claims, wake-ups and
lease renewals go on over the shards that answer); those on the killed node wait, and all
finish once it is back, none in ERROR. How long the survivors paused is printed (pytest -s
shows it), not asserted: the machine is shared and slow. docs/scaling.md has the numbers.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psycopg
import pytest

from tests import citus
from tests.acceptance.workers import client, start_worker, stop_worker, wait_for
from tests.apps import counter_app

pytestmark = pytest.mark.citus

N_WORKFLOWS = 200
N_STEPS = 6  # 3 marks (transactions) and 3 pure steps each
KILLED = 0  # index of the worker node killed


def _count(url: str, query: str, params: list[object] | None = None) -> int | None:
    """One number from the coordinator, or None while the cluster cannot answer."""
    try:
        with psycopg.connect(url, connect_timeout=5, options="-c statement_timeout=10s") as conn:
            row = conn.execute(query, params or []).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else int(row[0])


def _survivors_marks(url: str, ids: list[str]) -> int | None:
    # Pruned to the surviving node's shards: it answers while the other node is down.
    return _count(url, "SELECT count(*) FROM marks WHERE workflow_id = ANY(%s)", [ids])


def _live_finished(url: str, ids: list[str]) -> int | None:
    return _count(
        url,
        "SELECT count(*) FROM durable.workflows WHERE workflow_id = ANY(%s) AND status = 'SUCCESS'",
        [ids],
    )


def test_a_worker_node_killed_under_load(
    citus_cluster: citus.CitusCluster,
    citus_url: str,
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    url = citus_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE marks (workflow_id text NOT NULL, i int NOT NULL,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (workflow_id, i))"
        )
        conn.execute(
            "SELECT create_distributed_table('marks', 'workflow_id',"
            " colocate_with => 'durable.workflows')"
        )
    ids = [f"N{i}" for i in range(N_WORKFLOWS)]
    with psycopg.connect(url) as conn:
        ports = dict(
            conn.execute(
                "SELECT w, p.nodeport FROM unnest(%s::text[]) AS w JOIN pg_dist_shard_placement p"
                " ON p.shardid = get_shard_id_for_distribution_column('durable.workflows', w)",
                [ids],
            ).fetchall()
        )
    killed_port = citus_cluster.workers[KILLED].port
    on_dead = [w for w in ids if ports[w] == killed_port]
    on_live = [w for w in ids if ports[w] != killed_port]
    assert on_dead and on_live, "the workflows' shards are on both nodes"

    with client(url) as engine:
        for w in ids:
            engine.submit(counter_app.load, w, N_STEPS, workflow_id=w)
    # What the workers said, shown if one of them does not survive.
    log = os.environ.get("DURABLE_WORKER_LOG") or str(tmp_path / "worker")
    workers = [
        start_worker(subprocess_env, url, lease=2.0, concurrency=8, log=log and f"{log}.{i}")
        for i in range(2)
    ]
    total = N_WORKFLOWS * N_STEPS // 2
    restarted = False
    try:
        wait_for(
            lambda: (_count(url, "SELECT count(*) FROM marks") or 0) >= total // 3,
            timeout=180,
            what="a third of the steps",
        )
        before = _survivors_marks(url, on_live)
        citus_cluster.kill_worker(KILLED)
        killed_at = time.monotonic()
        # Wait until the survivors finish (or the outage has lasted too long for them).
        live_total = len(on_live) * N_STEPS // 2
        deadline = killed_at + 150
        errors_seen = 0
        while time.monotonic() < deadline:
            errors_seen = max(
                errors_seen,
                _count(
                    url,
                    "SELECT count(*) FROM durable.workflows"
                    " WHERE workflow_id = ANY(%s) AND status = 'ERROR'",
                    [on_live],
                )
                or 0,
            )
            if _live_finished(url, on_live) == len(on_live):
                break
            time.sleep(0.5)
        assert errors_seen == 0, "no workflow of the surviving node ends in ERROR"
        during = _survivors_marks(url, on_live)
        outage = time.monotonic() - killed_at
        # The surviving node's workflows all ran to their end while the other was down.
        assert during == live_total, (during, live_total)
        finished_live = _live_finished(url, on_live)
        assert finished_live == len(on_live), (finished_live, len(on_live))
        # The killed node's waited: none finished, none failed (their rows are on it).
        dead_marks = _count(
            url, "SELECT count(*) FROM marks WHERE workflow_id = ANY(%s)", [on_dead]
        )
        assert dead_marks is None, "the killed node's shards do not answer"
        citus_cluster.start_worker(KILLED)
        restarted = True
        back_at = time.monotonic()
        wait_for(
            lambda: _count(url, "SELECT count(*) FROM marks") == total,
            timeout=240,
            what="every step after the node came back",
        )
        wait_for(
            lambda: (
                _count(url, "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'")
                == N_WORKFLOWS
            ),
            timeout=240,
            what="every workflow to finish",
        )
        finish = time.monotonic() - back_at
        dead = [
            (i, proc.poll(), Path(f"{log}.{i}").read_text(errors="replace")[-3000:])
            for i, proc in enumerate(workers)
            if proc.poll() is not None
        ]
        assert not dead, f"the workers must survive: {dead}"
    finally:
        if not restarted:
            with contextlib.suppress(Exception):
                citus_cluster.start_worker(KILLED)
        for proc in workers:
            stop_worker(proc)

    with psycopg.connect(url) as conn:
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM durable.workflows GROUP BY 1").fetchall()
        )
        per_workflow = conn.execute(
            "SELECT count(*) FROM (SELECT workflow_id FROM marks GROUP BY 1"
            " HAVING count(*) = %s) AS full_runs",
            [N_STEPS // 2],
        ).fetchone()
        steps = conn.execute("SELECT count(*) FROM durable.steps").fetchone()
        # The survivors' longest pause between two committed steps while the node was
        # down (from the kill to the restart, on the database's clock).
        gaps = conn.execute(
            "SELECT max(gap) FROM (SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY at))"
            " AS gap FROM marks WHERE workflow_id = ANY(%s)) AS g",
            [on_live],
        ).fetchone()
    assert statuses == {"SUCCESS": N_WORKFLOWS}, statuses
    assert per_workflow is not None and per_workflow[0] == N_WORKFLOWS
    assert steps is not None and steps[0] == N_WORKFLOWS * N_STEPS
    progressed = (during or 0) - (before or 0)
    longest = float(gaps[0]) if gaps and gaps[0] is not None else 0.0
    print(
        f"\ncitus node failure: {len(on_dead)} workflows on the killed node, {len(on_live)} on"
        f" the other; node down {outage:.1f}s; the other node's workflows committed"
        f" {progressed} steps while it was down (of {len(on_live) * N_STEPS // 2 - (before or 0)}"
        f" left); their longest pause between two steps: {longest:.1f}s; every workflow finished"
        f" {finish:.1f}s after the node was back"
    )
