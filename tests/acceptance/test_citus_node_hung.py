"""A Citus worker node hangs (its postmaster and every backend SIGSTOPped: a frozen host,
its connections open, nothing answering) while two `durable worker` processes run
workflows on both nodes; it is thawed after FREEZE seconds.

The workflows are counter_app.load (as in test_citus_node_failure.py: every other step a
@transaction inserting into `marks`, colocated with durable's tables). The workflows whose
shards are on the other node must go on being claimed and finished during the freeze:
the test counts those that finish while the node is frozen, and after the thaw every
workflow finishes, none in ERROR, no mark twice. The survivors' longest pause between two
steps during the freeze is printed (pytest -s), not asserted. The workers run with the
default response_timeout (5 s). Before, every claim waited for the frozen node: none of the
other node's workflows finished during the freeze.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest

from tests import citus
from tests.acceptance.workers import client, start_worker, stop_worker, wait_for
from tests.apps import counter_app

pytestmark = pytest.mark.citus

N_WORKFLOWS = 400
N_STEPS = 4
FROZEN = 0  # index of the worker node frozen
FREEZE = 20.0


def _count(url: str, query: str, params: list[object] | None = None) -> int | None:
    """One number from the coordinator, or None while the cluster cannot answer."""
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            row = conn.execute(query, params or []).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else int(row[0])


def _finished(url: str, ids: list[str]) -> int | None:
    # Pruned to the shards of `ids`: it answers while the other node hangs.
    return _count(
        url,
        "SELECT count(*) FROM durable.workflows WHERE workflow_id = ANY(%s) AND status = 'SUCCESS'",
        [ids],
    )


def test_a_worker_node_that_hangs(
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
    ids = [f"F{i}" for i in range(N_WORKFLOWS)]
    with psycopg.connect(url) as conn:
        ports = dict(
            conn.execute(
                "SELECT w, p.nodeport FROM unnest(%s::text[]) AS w JOIN pg_dist_shard_placement p"
                " ON p.shardid = get_shard_id_for_distribution_column('durable.workflows', w)",
                [ids],
            ).fetchall()
        )
    frozen_port = citus_cluster.workers[FROZEN].port
    on_frozen = [w for w in ids if ports[w] == frozen_port]
    on_live = [w for w in ids if ports[w] != frozen_port]
    assert on_frozen and on_live, "the workflows' shards are on both nodes"

    with client(url) as engine:
        for w in ids:
            engine.submit(counter_app.load, w, N_STEPS, workflow_id=w)
    env = subprocess_env  # the default response_timeout
    log = os.environ.get("DURABLE_WORKER_LOG") or str(tmp_path / "worker")
    workers = [start_worker(env, url, lease=2.0, concurrency=4, log=f"{log}.{i}") for i in range(2)]
    pids: list[int] = []
    try:
        wait_for(
            lambda: (_finished(url, on_live) or 0) >= len(on_live) // 10,
            timeout=180,
            what="a tenth of the live node's workflows",
        )
        pids = citus_cluster.freeze_worker(FROZEN)
        frozen_at = time.monotonic()
        frozen_wall = time.time()
        before = _finished(url, on_live) or 0
        # Coordinator backends of durable's that a statement on the frozen node holds.
        stuck = 0
        while time.monotonic() < frozen_at + FREEZE:
            busy = _count(
                url,
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name LIKE 'durable%%' AND state = 'active'",
            )
            stuck = max(stuck, busy or 0)
            time.sleep(0.5)
        during = _finished(url, on_live) or 0
        citus.CitusCluster.thaw_worker(pids)
        pids = []
        wait_for(
            lambda: (
                _count(url, "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'")
                == N_WORKFLOWS
            ),
            timeout=300,
            what="every workflow to finish after the thaw",
        )
    finally:
        if pids:
            citus.CitusCluster.thaw_worker(pids)
        for proc in workers:
            stop_worker(proc)

    with psycopg.connect(url) as conn:
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM durable.workflows GROUP BY 1").fetchall()
        )
        full = conn.execute(
            "SELECT count(*) FROM (SELECT workflow_id FROM marks GROUP BY 1"
            " HAVING count(*) = %s) AS full_runs",
            [N_STEPS // 2],
        ).fetchone()
        # The live node's longest pause between two committed steps during the freeze.
        gaps = conn.execute(
            "SELECT gap, to_char(at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') FROM (SELECT at,"
            " extract(epoch FROM at - lag(at) OVER (ORDER BY at)) AS gap FROM marks"
            " WHERE workflow_id = ANY(%s)) AS g WHERE gap IS NOT NULL ORDER BY gap DESC LIMIT 1",
            [on_live],
        ).fetchone()
    longest = float(gaps[0]) if gaps and gaps[0] is not None else 0.0
    ended = gaps[1] if gaps else None
    print(
        f"\ncitus node hung {FREEZE:.0f}s: {len(on_live)} workflows on the other node,"
        f" {before} finished before; {during - before} finished during the freeze;"
        f" longest pause between two of their steps {longest:.1f}s; at most {stuck}"
        " coordinator backends of durable's busy at once;"
        f" frozen at {time.strftime('%H:%M:%S', time.gmtime(frozen_wall))}"
        f".{int(frozen_wall % 1 * 1000):03d} UTC, the longest pause ended at {ended} UTC"
    )
    assert statuses == {"SUCCESS": N_WORKFLOWS}, statuses
    assert full is not None and full[0] == N_WORKFLOWS
    # The other node's workflows went on being claimed and finished while this one hung.
    assert during - before > 0, (before, during)
