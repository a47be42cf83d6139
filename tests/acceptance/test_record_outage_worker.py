"""A `durable worker` whose steps return while the database is cut off (every connection
of the worker terminated, new ones refused for 1.5 s, well within the 10 s lease) sends
each step's record again at the same epoch once the database answers: every workflow
finishes, each step's side effect is in the world once, and no workflow was claimed
again. Before, the record's failure interrupted the run, and recovery ran the step a
second time."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

import durable
from tests.acceptance.workers import start_worker, stop_worker, wait_for, world
from tests.apps import counter_app, outage_app

APP = "tests.apps.outage_app"
OUTAGE = 1.5


def _cut_off(url: str, marker: Path) -> None:
    """Refuse new connections to the database and terminate the worker's, then let the
    held steps return (the marker) and reopen the database `OUTAGE` seconds later."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    admin_url = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    allow = 'ALTER DATABASE "{}" ALLOW_CONNECTIONS {}'
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(allow.format(name, "false").encode())
        try:
            cut = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))"
                " FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'durable%%'",
                [name],
            ).fetchone()
            assert cut is not None and cut[0] >= 1
            marker.touch()
            time.sleep(OUTAGE)
        finally:
            admin.execute(allow.format(name, "true").encode())


def _runs(url: str) -> list[tuple[str, str, int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, status, epoch, recovery_attempts FROM durable.workflows"
            " ORDER BY workflow_id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def _finished(url: str) -> bool:
    return all(durable.WorkflowStatus(status).is_terminal for _, status, _, _ in _runs(url))


def test_steps_that_record_during_an_outage_run_once_and_keep_their_epoch(
    database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    counter_app.setup(database_url)
    marker = tmp_path / "go"
    env = {**subprocess_env, "OUTAGE_MARKER": str(marker)}
    ids = [f"sync-{i}" for i in range(2)] + [f"async-{i}" for i in range(2)]
    worker = start_worker(env, database_url, app=APP, lease=10.0, concurrency=4)
    try:
        with durable.Client(database_url) as client:
            for workflow_id in ids:
                fn = outage_app.flow if workflow_id.startswith("sync") else outage_app.flow_async
                client.submit(fn, workflow_id, workflow_id=workflow_id)
        # The client's connections are closed: the outage cuts only the worker's.
        wait_for(lambda: len(world(database_url)) == len(ids), timeout=30, what="held steps")
        _cut_off(database_url, marker)
        wait_for(lambda: _finished(database_url), timeout=60, what="every workflow to end")
    finally:
        stop_worker(worker)
    seen = world(database_url)
    found = {
        w: (status, epoch, attempts, [what for v, what, _ in seen if v == w])
        for w, status, epoch, attempts in _runs(database_url)
    }
    # Each step ran once, and each run kept its claim (epoch 1, no recovery).
    assert found == {w: ("SUCCESS", 1, 0, ["charge", "after"]) for w in ids}
