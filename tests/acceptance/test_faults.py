"""Faults in real worker processes, judged by the world: the vendor's ledger, the effect
ledger, the journal and the stored status (never by log lines).

The workers run tests/apps/faults_app.py (`--app tests.apps.faults_app:engine`: one-second
leases, and a workflow is given up after two recoveries)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from tests.acceptance.workers import stop_worker, wait_for, world
from tests.apps import counter_app, faults_app, vendor

APP = "tests.apps.faults_app:engine"


def start_worker(
    env: dict[str, str], url: str, *, crash: str | None = None
) -> subprocess.Popen[bytes]:
    child_env = dict(env)
    child_env["DURABLE_DATABASE_URL"] = url
    child_env["DURABLE_LOG_LEVEL"] = env.get("DURABLE_LOG_LEVEL", "WARNING")
    if crash:
        child_env["DURABLE_CRASH_POINTS"] = crash
    return subprocess.Popen(
        [sys.executable, "-m", "durable.cli", "worker", "--app", APP, "--grace-seconds", "5"],
        env=child_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@contextmanager
def client(url: str) -> Iterator[durable.Client]:
    """Submits, cancels and reads workflows; runs none."""
    faults_app.setup(url)
    with durable.Client(url) as c:
        yield c


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args], capture_output=True, text=True, timeout=60
    )


def row(url: str, workflow_id: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        cur = conn.execute(
            "SELECT status, epoch, recovery_attempts, error, owner,"
            " lease_expires_at < now() AS lease_over, deadline_at < now() AS past_deadline"
            " FROM durable.workflows WHERE workflow_id = %s",
            [workflow_id],
        )
        found = cur.fetchone()
        assert found is not None, workflow_id
        assert cur.description is not None
        return dict(zip([c.name for c in cur.description], found, strict=True))


def ledger(url: str) -> list[tuple[str, str, str, bool]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1], r[2], r[3])
            for r in conn.execute(
                "SELECT effect_name, idempotency_key, status, reconciled FROM durable.effects"
                " ORDER BY step_seq"
            )
        ]


def whats(url: str, workflow_id: str) -> list[str]:
    return [what for _, what, _ in world(url, workflow_id)]


# -- 1. a pending effect is settled when its workflow is cancelled or times out ------------------


@pytest.mark.parametrize(
    ("workflow", "lease_over"),
    [
        pytest.param("order", True, id="step-first"),
        pytest.param("charge_first", True, id="effect-first"),
        pytest.param("charge_first", False, id="effect-first-lease-running"),
    ],
)
def test_cancel_settles_a_pending_effect_and_runs_its_compensation(
    database_url: str, subprocess_env: dict[str, str], workflow: str, lease_over: bool
) -> None:
    fn = getattr(faults_app, workflow)
    seq = 1 if workflow == "order" else 0  # the charge's position in the journal
    with client(database_url) as engine:
        handle = engine.submit(fn, "o1", 30, workflow_id="o1")
        # Dies right after the vendor took the money, before the effect was recorded.
        first = start_worker(subprocess_env, database_url, crash="effect_after_call:1")
        assert first.wait(timeout=30) == -signal.SIGKILL
        assert vendor.moved(database_url) == [30]
        assert ledger(database_url) == [("faults.charge", f"o1:{seq}", "pending", False)]
        if lease_over:
            # Nobody runs it now; the operator cancels it from the command line.
            wait_for(lambda: row(database_url, "o1")["lease_over"], timeout=10, what="lease")
            out = cli("workflows", "cancel", "o1", "--database-url", database_url)
            assert out.returncode == 0, out.stderr
        else:
            # Cancelled at once, while the dead worker's lease still runs.
            assert engine.cancel("o1", reason="cancelled from the command line") == "RUNNING"
        second = start_worker(subprocess_env, database_url)
        try:
            with pytest.raises(errors.WorkflowCancelledError, match="cancelled from the command"):
                handle.result(timeout=20)
            # A worker settles it before it ends, so give one a moment if it ended at once.
            wait_for(lambda: ledger(database_url)[0][2] != "pending", timeout=5, what="the settle")
        finally:
            stop_worker(second)
        assert handle.status() == "CANCELLED"
    # The charge was asked of the vendor (reconciled), recorded, then undone exactly once.
    assert vendor.moved(database_url) == [30, -30]
    assert ledger(database_url) == [
        ("faults.charge", f"o1:{seq}", "applied", True),
        ("faults.refund", f"o1:{seq + 1}", "applied", False),
    ]
    assert whats(database_url, "o1") == (["before"] if workflow == "order" else [])


def test_timeout_settles_a_pending_effect_and_runs_its_compensation(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(faults_app.order_in_time, "t1", 45, workflow_id="t1")
        first = start_worker(subprocess_env, database_url, crash="effect_after_call:1")
        assert first.wait(timeout=30) == -signal.SIGKILL
        assert vendor.moved(database_url) == [45]
        assert ledger(database_url) == [("faults.charge", "t1:1", "pending", False)]
        # The timeout (3 s from the first start) passes while no process runs it.
        wait_for(lambda: row(database_url, "t1")["past_deadline"], timeout=10, what="deadline")
        second = start_worker(subprocess_env, database_url)
        try:
            with pytest.raises(errors.WorkflowTimeoutError):
                handle.result(timeout=20)
        finally:
            stop_worker(second)
        assert handle.status() == "CANCELLED"
    stored = row(database_url, "t1")
    assert "WorkflowTimeoutError" in stored["error"]
    assert vendor.moved(database_url) == [45, -45]
    assert ledger(database_url) == [
        ("faults.charge", "t1:1", "applied", True),
        ("faults.refund", "t1:2", "applied", False),
    ]
    assert whats(database_url, "t1") == ["before"]


# -- 3. exceptions that cannot be printed, and SystemExit / KeyboardInterrupt in a step ----------


def test_an_exception_whose_str_raises_ends_the_workflow_error(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(faults_app.unprintable, "u1", workflow_id="u1")
        worker = start_worker(subprocess_env, database_url)
        try:
            with pytest.raises(errors.WorkflowFailedError) as info:
                handle.result(timeout=15)
        finally:
            stop_worker(worker)
        assert handle.status() == "ERROR"
        assert info.value.error_type == "tests.apps.faults_app.Unprintable"
        assert "Unprintable whose str() raised" in str(info.value)
        (step,) = engine.steps("u1")
        assert step.error is not None and "whose str() raised" in step.error
    stored = row(database_url, "u1")
    assert (stored["status"], stored["recovery_attempts"]) == ("ERROR", 0)
    assert whats(database_url, "u1") == ["unprintable"]  # run once, not retried


# One kind per worker process; both, in an engine's own threads:
# test_exit_in_a_step_of_an_engine_is_given_up_and_recovered (below).
@pytest.mark.parametrize("kind", ["SystemExit"])
def test_exit_in_every_run_ends_max_recovery_attempts_exceeded(
    database_url: str, subprocess_env: dict[str, str], kind: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(faults_app.exiting, "x1", kind, 99, workflow_id="x1")
        worker = start_worker(subprocess_env, database_url)
        try:
            wait_for(
                lambda: handle.status() == "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
                timeout=15,
                what="the workflow to be given up",
            )
            assert worker.poll() is None  # the worker itself lives on
        finally:
            stop_worker(worker)
    stored = row(database_url, "x1")
    assert stored["owner"] is None and stored["recovery_attempts"] >= 2
    # The first run and one per recovery: each exit gave the workflow up at once.
    assert whats(database_url, "x1") == ["exit-step"] * (faults_app.MAX_RECOVERY_ATTEMPTS + 1)


@pytest.mark.parametrize("kind", ["KeyboardInterrupt"])
def test_exit_once_costs_one_recovery_attempt(
    database_url: str, subprocess_env: dict[str, str], kind: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(faults_app.exiting, "x2", kind, 1, workflow_id="x2")
        worker = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=15) == 2
        finally:
            stop_worker(worker)
    stored = row(database_url, "x2")
    assert (stored["status"], stored["recovery_attempts"]) == ("SUCCESS", 1)
    assert whats(database_url, "x2") == ["exit-step", "exit-step", "after-exit"]


def test_exit_in_a_step_of_an_engine_is_given_up_and_recovered(database_url: str) -> None:
    """The same in an Engine's own threads (worker=True): the engine's process goes on."""
    faults_app.setup(database_url)
    counter_app.World.url = database_url
    with durable.Engine(
        database_url,
        registry=faults_app.registry,
        worker=True,
        poll_interval=0.05,
        lease_seconds=1.0,
        max_recovery_attempts=2,
    ) as engine:
        once = engine.submit(faults_app.exiting, "e1", "KeyboardInterrupt", 1, workflow_id="e1")
        always = engine.submit(faults_app.exiting, "e2", "SystemExit", 99, workflow_id="e2")
        assert once.result(timeout=15) == 2
        deadline = time.monotonic() + 15
        while always.status() != "MAX_RECOVERY_ATTEMPTS_EXCEEDED":
            assert time.monotonic() < deadline, always.status()
            time.sleep(0.05)
    assert (row(database_url, "e1")["recovery_attempts"], row(database_url, "e2")["owner"]) == (
        1,
        None,
    )
    assert whats(database_url, "e1") == ["exit-step", "exit-step", "after-exit"]
    assert whats(database_url, "e2") == ["exit-step"] * 3


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt"])
def test_exit_in_a_step_does_not_leak_into_the_caller_of_result(
    database_url: str, kind: str
) -> None:
    faults_app.setup(database_url)
    counter_app.World.url = database_url
    with durable.Engine(
        database_url,
        registry=faults_app.registry,
        worker=True,
        poll_interval=0.05,
        lease_seconds=1.0,
        max_recovery_attempts=2,
    ) as engine:
        handle = engine.start(faults_app.exiting, "r1", kind, 1, workflow_id="r1")
        value: object
        try:
            value = handle.result(timeout=15)
        except BaseException as exc:  # a KeyboardInterrupt here would end the test session
            value = exc
        wait_for(lambda: handle.status() == "SUCCESS", timeout=15, what="the recovery")
    assert value == 2, f"result() raised {value!r}, yet the workflow went on to succeed"
    assert whats(database_url, "r1") == ["exit-step", "exit-step", "after-exit"]
