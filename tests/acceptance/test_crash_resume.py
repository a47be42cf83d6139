"""SIGKILL a real process at the worst moments, recover in a fresh one, check the world."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psycopg
import pytest

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


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_sigkill_after_second_step_resumes_at_third(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    subprocess_env = {**subprocess_env, "DURABLE_TEST_DRIVER": driver}
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


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_sigkill_inside_step_before_record_reruns_only_that_step(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    subprocess_env = {**subprocess_env, "DURABLE_TEST_DRIVER": driver}
    crashed = run_app(subprocess_env, "run", database_url, "wf-b", crash="before_step_record:2")
    assert crashed.returncode == -signal.SIGKILL
    assert world(database_url, "wf-b") == ["s1", "s2"]
    assert journal(database_url, "wf-b") == [(0, "step")]
    resumed = run_app(subprocess_env, "recover", database_url, "wf-b")
    assert resumed.returncode == 0, resumed.stderr
    # At-least-once: step 2's work happened twice because its record never committed.
    assert world(database_url, "wf-b") == ["s1", "s2", "s2", "s3"]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_sigkill_before_status_written(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    subprocess_env = {**subprocess_env, "DURABLE_TEST_DRIVER": driver}
    crashed = run_app(subprocess_env, "run", database_url, "wf-e", crash="before_workflow_finish:1")
    assert crashed.returncode == -signal.SIGKILL
    assert status(database_url, "wf-e") == "RUNNING"
    resumed = run_app(subprocess_env, "recover", database_url, "wf-e")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == ["S1", "S2", "S3"]
    assert world(database_url, "wf-e") == ["s1", "s2", "s3"]


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("when", ["before_transaction_commit", "after_transaction_commit"])
def test_transaction_row_and_journal_commit_together(
    database_url: str, subprocess_env: dict[str, str], when: str, driver: str
) -> None:
    subprocess_env = {**subprocess_env, "DURABLE_TEST_DRIVER": driver}
    # Kill at the second refund: o1 is committed; o2 is in flight.
    crashed = run_app(subprocess_env, "run", database_url, "wf-t", "refunds", crash=f"{when}:2")
    assert crashed.returncode == -signal.SIGKILL
    kinds = [k for _, k in journal(database_url, "wf-t")]
    if when == "before_transaction_commit":
        # Neither the app row nor the journal row of o2 exists.
        assert refunds(database_url) == [("o1", 10)]
        assert kinds == ["transaction", "step"]
    else:
        # Both exist.
        assert refunds(database_url) == [("o1", 10), ("o2", 25)]
        assert kinds == ["transaction", "step", "transaction"]

    resumed = run_app(subprocess_env, "recover", database_url, "wf-t", "refunds")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == 75
    # Replay never writes a refund twice.
    assert refunds(database_url) == [("o1", 10), ("o2", 25), ("o3", 40)]
    assert status(database_url, "wf-t") == "SUCCESS"
