"""A workflow started inside the application's transaction (`conn=`), across real SIGKILLs:
killed right after the application's commit, a fresh worker runs it exactly once; killed
before the commit, neither the order nor the workflow exists. Through an outbox (another
database), a drainer killed between the workflow's insert and the outbox row's delete
leaves exactly one run after a fresh worker drains it again."""

from __future__ import annotations

import signal
import subprocess
import sys

import psycopg

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app

STEPS = [("s1",), ("s2",), ("s3",)]


def _app(env: dict[str, str], mode: str, url: str, order_id: str) -> int:
    return subprocess.run(
        [sys.executable, "-m", "tests.apps.txn_app", mode, url, order_id],
        env=env,
        timeout=120,
        check=False,
    ).returncode


def _steps(url: str, workflow_id: str) -> list[tuple[str]]:
    return [(what,) for _, what, _ in world(url, workflow_id)]


def test_killed_right_after_its_commit_the_workflow_runs_once_elsewhere(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    # Killed before its commit: no order, no workflow, nothing to run.
    assert _app(subprocess_env, "before_commit", database_url, "o-1") == -signal.SIGKILL
    assert scalar(database_url, "SELECT count(*) FROM orders") == 0
    assert scalar(database_url, "SELECT count(*) FROM durable.workflows") == 0
    # Killed right after its commit, before its engine could claim or launch anything.
    assert _app(subprocess_env, "after_commit", database_url, "o-2") == -signal.SIGKILL
    assert scalar(database_url, "SELECT count(*) FROM orders WHERE order_id = 'o-2'") == 1
    status = "SELECT status FROM durable.workflows WHERE workflow_id = 'o-2'"
    assert scalar(database_url, status) == "PENDING"  # nobody ran it
    worker = start_worker(subprocess_env, database_url)
    try:
        with durable.Client(database_url) as client:
            assert client.retrieve("o-2").result(timeout=60) == ["S1", "S2", "S3"]
    finally:
        stop_worker(worker)
    assert _steps(database_url, "o-2") == STEPS  # each step once
    assert scalar(database_url, "SELECT count(*) FROM durable.workflows") == 1


def test_a_drain_killed_before_it_deletes_the_outbox_row_starts_nothing_twice(
    database_url: str, bare_database_url: str, subprocess_env: dict[str, str]
) -> None:
    counter_app.setup(database_url)
    app = bare_database_url  # the application's own database, not durable's
    with durable.Client(database_url, outbox_url=app) as client:
        client.install_outbox()
        with psycopg.connect(app) as conn:
            client.submit(counter_app.three_steps, "o-3", workflow_id="o-3", conn=conn)
            conn.commit()
    drain = [sys.executable, "-m", "durable.cli", "outbox", "drain", "--url", app]
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    # Killed after the workflow's row is committed in durable's database, before the
    # outbox row is deleted (its transaction in the application database dies with it).
    crash = {**env, "DURABLE_CRASH_POINTS": "outbox_before_done"}
    assert subprocess.run(drain, env=crash, timeout=120, check=False).returncode == -9
    assert scalar(app, "SELECT count(*) FROM durable.outbox") == 1
    assert scalar(database_url, "SELECT count(*) FROM durable.workflows") == 1
    # A fresh worker drains it: the row is written again (a no-op: its id exists) and
    # deleted; the workflow runs once.
    worker = start_worker(subprocess_env, database_url, extra=["--outbox-url", app])
    try:
        with durable.Client(database_url) as client:
            assert client.retrieve("o-3").result(timeout=60) == ["S1", "S2", "S3"]
        wait_for(lambda: scalar(app, "SELECT count(*) FROM durable.outbox") == 0, 60, "drain")
    finally:
        stop_worker(worker)
    assert _steps(database_url, "o-3") == STEPS  # one run, each step once
    assert scalar(database_url, "SELECT count(*) FROM durable.workflows") == 1
