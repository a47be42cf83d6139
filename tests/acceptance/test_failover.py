"""A PostgreSQL failover under two running workers loses nothing.

A pg_auto_failover pair (tests/ha.py): a primary and a synchronous standby on loopback.
300 workflows of 10 journaled positions (sync, durability="async" and `async def`), one of
them a payment to a vendor that does not deduplicate keys, run on two `durable worker`
processes that know both nodes only through a multi-host URL. Midway the primary's
postmaster and supervisor are SIGKILLed; the monitor promotes the standby. The world
(every run of a step's code, every payment that moved) is kept on another server, which
the failover does not touch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

import durable
from tests import ha
from tests.acceptance.workers import start_worker, stop_worker, wait_for
from tests.apps import failover_app

N_WORKFLOWS = int(os.environ.get("DURABLE_FAILOVER_WORKFLOWS", "300"))


@pytest.fixture
def cluster() -> Iterator[ha.HACluster]:
    try:
        ha.ensure_installed()
    except ha.Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    with ha.ha_cluster() as running:
        yield running


def count(url: str, query: str, *args: object) -> int:
    with psycopg.connect(url, connect_timeout=2) as conn:
        row = conn.execute(query, list(args)).fetchone()
    assert row is not None
    return int(row[0])


def unfinished(url: str) -> str:
    with psycopg.connect(url, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT w.workflow_id, status, owner, epoch, lease_expires_at - now(),"
            " recovery_attempts, (SELECT count(*) FROM durable.steps s"
            " WHERE s.workflow_id = w.workflow_id) FROM durable.workflows w"
            " WHERE status <> 'SUCCESS' ORDER BY 1 LIMIT 20"
        ).fetchall()
        executors = conn.execute("SELECT * FROM durable.executors").fetchall()
    return "\n".join(map(str, [*rows, *executors]))


def stacks(workers: list[subprocess.Popen[bytes]]) -> str:
    """Where each worker's threads are (py-spy, when installed), for a hang."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return "(pip install py-spy to see the workers' stacks)"
    out = [
        subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True).stdout
        for p in workers
    ]
    return "\n".join(out)


def story(world: str, workflow_id: str, killed_at: datetime) -> str:
    """Who ran which position of a workflow, and when (seconds after the kill)."""
    with psycopg.connect(world) as conn:
        rows = conn.execute(
            "SELECT position, pid, at FROM failover_world WHERE workflow_id = %s ORDER BY id",
            [workflow_id],
        ).fetchall()
    runs = [f"{p} by {pid} at {(at - killed_at).total_seconds():+.2f} s" for p, pid, at in rows]
    return f"{workflow_id}: " + ", ".join(runs)


def twice_paid(world: str, killed_at: datetime, logs: list[Path]) -> str:
    """The story of every workflow whose payment ran more than once."""
    with psycopg.connect(world) as conn:
        ids = conn.execute(
            "SELECT workflow_id FROM failover_world WHERE position = %s"
            " GROUP BY 1 HAVING count(*) > 1",
            [failover_app.EFFECT_AT],
        ).fetchall()
    told = []
    for (workflow_id,) in ids:
        told.append(story(world, workflow_id, killed_at))
        for log in logs:
            lines = log.read_text(errors="replace").splitlines()
            told += [f"{log.name}: {ln}" for ln in lines if f"{workflow_id} " in ln]
    return "\n".join(told)


def successes(url: str) -> int:
    try:
        return count(url, "SELECT count(*) FROM durable.workflows WHERE status = 'SUCCESS'")
    except psycopg.OperationalError:
        return -1  # mid-failover


def test_failover_under_two_workers_loses_nothing(
    cluster: ha.HACluster, database_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    world = database_url  # the ordinary test server: outlives the HA pair's primary
    failover_app.setup(world)
    env = dict(subprocess_env, DURABLE_VENDOR_URL=world, DURABLE_LOG_LEVEL="INFO")
    # A third each: sync journal writes, the background writer (durability="async"), and
    # `async def` workflows on the async pool.
    kinds = [failover_app.ten, failover_app.ten_batched, failover_app.ten_async]
    with durable.Client(cluster.url, migrate=True) as client:
        for i in range(N_WORKFLOWS):
            client.submit(kinds[i % 3], f"F{i}", workflow_id=f"F{i}")  # type: ignore[arg-type]
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers = [
        start_worker(
            env, cluster.url, app="tests.apps.failover_app", lease=2.0, concurrency=8, log=str(log)
        )
        for log in logs
    ]
    try:
        wait_for(lambda: successes(cluster.url) >= N_WORKFLOWS // 3, timeout=300, what="a third")
        t0 = time.monotonic()
        old = cluster.kill_primary()
        killed_at = datetime.now().astimezone()  # the old primary is gone by now
        new = cluster.wait_promoted()
        promoted_after = time.monotonic() - t0
        try:
            wait_for(lambda: successes(cluster.url) == N_WORKFLOWS, timeout=120, what="all")
        except AssertionError:
            raise AssertionError(
                f"not every workflow finished:\n{unfinished(cluster.url)}\n{stacks(workers)}"
            ) from None
        for proc in workers:
            assert proc.poll() is None, "a worker must survive the failover"
    finally:
        for proc in workers:
            stop_worker(proc)
    assert new is not old
    with psycopg.connect(cluster.url) as conn:
        statuses: dict[str, int] = dict(
            conn.execute("SELECT status, count(*) FROM durable.workflows GROUP BY 1").fetchall()
        )
        journaled = conn.execute(
            "SELECT workflow_id, array_agg(step_seq ORDER BY step_seq) FROM durable.steps"
            " GROUP BY 1"
        ).fetchall()
        applied = conn.execute(
            "SELECT count(*) FROM durable.effects WHERE status = 'applied'"
        ).fetchone()
        # Everything journaled after the kill was committed by the promoted standby.
        first_new = conn.execute(
            "SELECT min(finished_at) FROM durable.steps WHERE finished_at > %s", [killed_at]
        ).fetchone()
    assert statuses == {"SUCCESS": N_WORKFLOWS}
    assert len(journaled) == N_WORKFLOWS
    assert all(list(p) == list(range(failover_app.STEPS)) for _, p in journaled)
    assert applied == (N_WORKFLOWS,)
    with psycopg.connect(world) as conn:
        moved = conn.execute(
            "SELECT count(*), count(DISTINCT idempotency_key) FROM vendor_moved"
        ).fetchone()
        runs = conn.execute(
            "SELECT workflow_id, array_agg(position ORDER BY id) FROM failover_world GROUP BY 1"
        ).fetchall()
    # Every payment moved exactly once, although the vendor does not deduplicate.
    assert moved == (N_WORKFLOWS, N_WORKFLOWS), twice_paid(world, killed_at, logs)
    # No journaled step was lost: a step's code starts only after the previous step's
    # journal row committed (and reached the standby), so if a committed row were lost
    # the earlier step would run again after a later one; per workflow the positions run
    # never go back. A step cut off before its commit may run twice, one after the other.
    for workflow_id, positions in runs:
        assert set(positions) == set(range(failover_app.STEPS)), (workflow_id, positions)
        # durability="async" acknowledges a step before its row commits (its barrier is
        # the effect and the end): a cut-off batch legitimately runs steps again.
        # A claim that waited in a worker's queue through the outage is looked up before
        # it runs, so it never runs a step of a workflow another worker finished.
        if int(str(workflow_id)[1:]) % 3 != 1:
            assert list(positions) == sorted(positions), story(world, str(workflow_id), killed_at)
    rerun = sum(len(p) - failover_app.STEPS for _, p in runs)
    assert first_new is not None and first_new[0] is not None
    resumed_after = (first_new[0] - killed_at).total_seconds()
    # Each worker said what happened in one line when it lost the primary, and in one
    # when it was back (the promoted server's restart moments later is the same event).
    for log in logs:
        text = log.read_text(errors="replace")
        lost = text.count("lost the system database at")
        back = text.count("the system database is back after")
        said = [ln for ln in text.splitlines() if "system database" in ln]
        assert (lost, back) == (1, 1), said or text[-3000:]
    print(
        f"\nfailover: standby writable {promoted_after:.1f} s after the kill, first step "
        f"journaled {resumed_after:.1f} s after it; {rerun} step runs repeated (cut off "
        "before their commit)"
    )
