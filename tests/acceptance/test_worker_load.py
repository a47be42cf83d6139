"""Load and outage: many workflows on two worker processes, one SIGKILLed midway; and a
PostgreSQL restart under a running worker. Everything completes, nothing runs twice."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest

import durable
from tests import private_pg
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for
from tests.apps import counter_app

N_WORKFLOWS = int(os.environ.get("DURABLE_LOAD_WORKFLOWS", "1000"))


def count_status(url: str, status: str) -> int:
    return int(str(scalar(url, "SELECT count(*) FROM durable.workflows WHERE status = %s", status)))


def running_on(url: str, pid: int) -> int:
    """How many workflows the worker process `pid` holds running now."""
    query = (
        "SELECT count(*) FROM durable.workflows AS w JOIN durable.executors AS e"
        " ON e.executor_id = w.owner WHERE e.pid = %s AND w.status = 'RUNNING'"
    )
    return int(str(scalar(url, query, pid)))


def test_load_with_a_worker_killed(database_url: str, subprocess_env: dict[str, str]) -> None:
    with client(database_url) as engine:
        for i in range(N_WORKFLOWS):
            engine.submit(counter_app.load, f"L{i}", 10, workflow_id=f"L{i}")
        a = start_worker(subprocess_env, database_url, lease=2.0, concurrency=8)
        workers = [a]
        try:
            # A is running work before B starts (on a busy machine a slow start could
            # leave it nothing to do), and it is killed midway while it holds some.
            wait_for(lambda: running_on(database_url, a.pid) > 0, timeout=120, what="A")
            workers.append(start_worker(subprocess_env, database_url, lease=2.0, concurrency=8))
            wait_for(
                lambda: (
                    count_status(database_url, "SUCCESS") >= N_WORKFLOWS // 3
                    and running_on(database_url, a.pid) > 0
                ),
                timeout=300,
                what="a third of the workflows, and worker A running some",
            )
            a.send_signal(signal.SIGKILL)
            a.wait()
            wait_for(
                lambda: count_status(database_url, "SUCCESS") == N_WORKFLOWS,
                timeout=300,
                what="every workflow",
            )
        finally:
            for proc in workers:
                stop_worker(proc)
    assert count_status(database_url, "ERROR") == 0
    # marks has UNIQUE (workflow_id, i): a transaction step that ran twice would have failed.
    assert scalar(database_url, "SELECT count(*) FROM marks") == N_WORKFLOWS * 5
    # Both workers did work, and recovery took over what the killed one held.
    assert int(str(scalar(database_url, "SELECT max(epoch) FROM durable.workflows"))) >= 2


# Connections cut by the restart may be finalized by the garbage collector in the test
# process; that is expected here, not a leak.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_postgres_restart_under_a_worker(subprocess_env: dict[str, str]) -> None:
    """On a server of the test's own (tests/private_pg.py): restarting the shared one would
    cut off every test running beside this one."""
    if not private_pg.available():
        pytest.skip("needs PostgreSQL's server binaries (initdb, pg_ctl) for a server of its own")
    with private_pg.private_server() as server:
        database_url = server.create_database("durable_restart")
        durable.Client(database_url, migrate=True).close()
        _restart_under_a_worker(server, database_url, subprocess_env)


def _restart_under_a_worker(
    server: private_pg.PrivateServer, database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handles = [
            engine.submit(counter_app.slow, f"R{i}", 8, 0.1, workflow_id=f"R{i}") for i in range(12)
        ]
        worker = start_worker(
            subprocess_env,
            database_url,
            lease=2.0,
            concurrency=4,
            log=os.environ.get("DURABLE_WORKER_LOG"),
        )
        try:
            wait_for(lambda: count_status(database_url, "SUCCESS") >= 2, what="some progress")
            server.pg_ctl("restart", "-m", "fast")
            deadline = time.monotonic() + 120
            while True:
                try:
                    if count_status(database_url, "SUCCESS") == len(handles):
                        break
                except psycopg.OperationalError:
                    pass
                assert time.monotonic() < deadline, "workflows did not finish after the restart"
                time.sleep(0.2)
            assert worker.poll() is None, "the worker must survive the restart"
        finally:
            stop_worker(worker)
    # Each step recorded exactly once; each workflow has all its steps.
    assert scalar(database_url, "SELECT count(*) FROM durable.steps") == 12 * 8
    assert count_status(database_url, "ERROR") == 0
