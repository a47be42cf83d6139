"""Parallel async steps (and children) under asyncio.gather, SIGKILLed once six of ten
were journaled: a worker in a fresh process runs only the ones not journaled and returns the
same list in the same order."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psycopg
import pytest

from tests.acceptance.workers import scalar, stop_worker, wait_for

APP = "tests.apps.parallel_app"


def calls(url: str, workflow_id: str) -> list[tuple[int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT i, pid FROM calls WHERE workflow_id = %s ORDER BY id", [workflow_id]
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


@pytest.mark.parametrize("kind", ["steps", "children"])
def test_a_kill_after_six_of_ten_parallel_steps_reruns_only_the_other_four(
    database_url: str, subprocess_env: dict[str, str], kind: str
) -> None:
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    workflow_id = f"fan-{kind}"
    first = subprocess.run(
        [sys.executable, "-m", APP, kind, workflow_id],
        env={**env, "DURABLE_CRASH_POINTS": "after_step_record:6"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr
    before = calls(database_url, workflow_id)
    (first_pid,) = {pid for _, pid in before}
    # Which positions the journal holds (a step of the parent, or of each child).
    with psycopg.connect(database_url) as conn:
        journaled = {
            r[0]
            for r in conn.execute(
                "SELECT (output::int) FROM durable.steps WHERE kind = 'step'"
                " AND (workflow_id = %s OR workflow_id LIKE %s)",
                [workflow_id, f"{workflow_id}:child:%"],
            ).fetchall()
        }
    squares = {i * i for i in range(10)}
    # The kill comes when the sixth record has returned to its task; another task's record,
    # on its own connection, may have committed in that instant, so six or more are kept.
    assert 6 <= len(journaled) <= 9 and journaled <= squares

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable.cli",
            "worker",
            "--app",
            APP,
            "--lease-seconds",
            "1",
            "--poll-interval",
            "0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                scalar(
                    database_url,
                    "SELECT status FROM durable.workflows WHERE workflow_id = %s",
                    workflow_id,
                )
                == "SUCCESS"
            ),
            timeout=60,
            what="the recovered workflow",
        )
    finally:
        stop_worker(worker)
    output = scalar(
        database_url, "SELECT output FROM durable.workflows WHERE workflow_id = %s", workflow_id
    )
    assert json.loads(str(output)) == [i * i for i in range(10)]  # same list, same order
    after = [(i, pid) for i, pid in calls(database_url, workflow_id) if pid != first_pid]
    rerun = sorted(i for i, _ in after)
    assert rerun == sorted(i for i in range(10) if i * i not in journaled)  # only the others
    assert len(rerun) == 10 - len(journaled)
