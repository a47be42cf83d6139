"""Moving a live deployment onto Citus, as docs/scaling.md's runbook says: a `durable worker`
runs on a plain (not yet distributed) schema in a Citus coordinator's database, with
workflows running, sleeping, waiting for a message and waiting for an approval; then
1. stop the workers (SIGTERM, wait for them to exit),
2. `durable migrate --citus`,
3. start the workers again.
Every workflow started before finishes after, each step recorded once in the world.
"""

from __future__ import annotations

import collections
import subprocess
import sys

import psycopg
import pytest

import durable
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for
from tests.apps import counter_app

pytestmark = pytest.mark.citus

SLOW = [f"slow{i}" for i in range(3)]
NAPS = [f"nap{i}" for i in range(2)]
WAITS = [f"wait{i}" for i in range(2)]
GATE = "gate"
STEPS = 60  # of 0.2s each: still running when the worker is stopped


def status_of(url: str, workflow_id: str) -> str:
    return str(
        scalar(url, "SELECT status FROM durable.workflows WHERE workflow_id = %s", workflow_id)
    )


def steps_of(url: str, workflow_id: str) -> int:
    return int(
        str(scalar(url, "SELECT count(*) FROM durable.steps WHERE workflow_id = %s", workflow_id))
    )


def test_runbook_moves_running_and_waiting_workflows_onto_citus(
    citus_bare_url: str, subprocess_env: dict[str, str]
) -> None:
    url = citus_bare_url
    with durable.Client(url, migrate=True):
        pass
    with client(url) as engine:
        for w in SLOW:
            engine.submit(counter_app.slow, w, STEPS, 0.2, workflow_id=w)
        for w in NAPS:
            engine.submit(counter_app.napper, w, 5.0, workflow_id=w)
        for w in WAITS:
            engine.submit(counter_app.booked_wait, w, workflow_id=w)
        engine.submit(counter_app.big_refund, 5000, None, workflow_id=GATE)
    # The stop leaves the slow workflows mid-way (handed over at a step boundary).
    worker = start_worker(subprocess_env, url, lease=2.0, concurrency=8, grace=1.0)
    try:
        wait_for(
            lambda: all(status_of(url, w) == "SUCCESS" or steps_of(url, w) >= 2 for w in SLOW),
            timeout=120,
            what="the slow workflows under way",
        )
        wait_for(
            lambda: all(status_of(url, w) == "SUSPENDED" for w in [*NAPS, *WAITS, GATE]),
            timeout=120,
            what="the others suspended (sleep, recv, approval) while the slow ones run",
        )
        # 1. Stop the workers.
        stop_worker(worker, timeout=60)
    finally:
        stop_worker(worker)
    assert any(status_of(url, w) != "SUCCESS" for w in SLOW), "some work is left to move"

    # 2. Distribute.
    done = subprocess.run(
        [sys.executable, "-m", "durable.cli", "migrate", "--citus", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "distributed" in done.stdout
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_dist_partition"
            " WHERE logicalrelid = 'durable.workflows'::regclass"
        ).fetchone()
    assert row is not None and row[0] == 1

    # 3. Start the workers again; the waiting workflows get what they wait for.
    worker = start_worker(subprocess_env, url, lease=2.0, concurrency=8)
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
            everyone = [*SLOW, *NAPS, *WAITS, GATE]
            wait_for(
                lambda: all(status_of(url, w) == "SUCCESS" for w in everyone),
                timeout=180,
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
    assert scalar(url, "SELECT count(*) FROM durable.workflows WHERE status <> 'SUCCESS'") == 0


def counter_app_world(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT workflow_id, what FROM world ORDER BY id").fetchall()
    return [(r[0], r[1]) for r in rows]
