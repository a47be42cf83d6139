"""SIGKILL a real process at the worst moments, recover in a fresh one, check the world.

One real kill per fenced write of a run: the step record (plain def), the finish and the
`@transaction` commit (async def). The rest of the matrix (both drivers, each side of each
write, a step cut off before its record) dies in one process: tests/integration/
test_crash_inprocess.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psycopg

APP = "tests.apps.counter_app"


def run_app(
    env: dict[str, str], *args: str, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the counter app; `env["DURABLE_TEST_DRIVER"]` picks plain-def or async def."""
    child_env = dict(env)
    if crash:
        child_env["DURABLE_CRASH_POINTS"] = crash
    return subprocess.run(
        [sys.executable, "-m", APP, *args],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def world(url: str, workflow_id: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT what FROM world WHERE workflow_id = %s ORDER BY id", [workflow_id]
        ).fetchall()
    return [r[0] for r in rows]


def refunds(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1]) for r in conn.execute("SELECT order_id, cents FROM refunds ORDER BY id")
        ]


def journal(url: str, workflow_id: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1])
            for r in conn.execute(
                "SELECT step_seq, kind FROM durable.steps WHERE workflow_id = %s ORDER BY step_seq",
                [workflow_id],
            )
        ]


def status(url: str, workflow_id: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = %s", [workflow_id]
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_sigkill_after_second_step_resumes_at_third(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    subprocess_env = {**subprocess_env, "DURABLE_TEST_DRIVER": "sync"}
    crashed = run_app(subprocess_env, "run", database_url, "wf-3", crash="after_step_record:2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert world(database_url, "wf-3") == ["s1", "s2"]
    assert status(database_url, "wf-3") == "RUNNING"

    resumed = run_app(subprocess_env, "recover", database_url, "wf-3")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == ["S1", "S2", "S3"]
    # Steps 1 and 2 did not run again; step 3 ran exactly once.
    assert world(database_url, "wf-3") == ["s1", "s2", "s3"]
    assert status(database_url, "wf-3") == "SUCCESS"


def test_sigkill_before_status_written(database_url: str, subprocess_env: dict[str, str]) -> None:
    subprocess_env = {**subprocess_env, "DURABLE_TEST_DRIVER": "async"}
    crashed = run_app(subprocess_env, "run", database_url, "wf-e", crash="before_workflow_finish:1")
    assert crashed.returncode == -signal.SIGKILL
    assert status(database_url, "wf-e") == "RUNNING"
    resumed = run_app(subprocess_env, "recover", database_url, "wf-e")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == ["S1", "S2", "S3"]
    assert world(database_url, "wf-e") == ["s1", "s2", "s3"]


def test_transaction_row_and_journal_commit_together(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    subprocess_env = {**subprocess_env, "DURABLE_TEST_DRIVER": "async"}
    # Kill right after the second refund's commit: its app row and its journal row are
    # both there (before that commit, neither: tests/integration/test_crash_inprocess.py).
    crashed = run_app(
        subprocess_env, "run", database_url, "wf-t", "refunds", crash="after_transaction_commit:2"
    )
    assert crashed.returncode == -signal.SIGKILL
    assert refunds(database_url) == [("o1", 10), ("o2", 25)]
    assert [k for _, k in journal(database_url, "wf-t")] == ["transaction", "step", "transaction"]

    resumed = run_app(subprocess_env, "recover", database_url, "wf-t", "refunds")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == 75
    # Replay never writes a refund twice.
    assert refunds(database_url) == [("o1", 10), ("o2", 25), ("o3", 40)]
    assert status(database_url, "wf-t") == "SUCCESS"
