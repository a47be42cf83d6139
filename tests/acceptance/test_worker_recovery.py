"""The recovery daemon: real worker processes, SIGKILL at the worst moments, then check the
world. Plain steps are at-least-once (a step whose record did not commit runs again);
journaled steps never re-run; @transaction rows exist exactly once."""

from __future__ import annotations

import dataclasses
import signal
import time

import pytest

import durable
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app

# One real kill, recovered by the worker daemon: the side of the `@transaction` commit that
# tests/acceptance/test_crash_resume.py does not kill. Every cell (before a step, before and
# after its record, before the finish, each side of the commit), both drivers, dies in one
# process: tests/integration/test_crash_inprocess.py.
CELLS = {
    # cell: (crash point, workflow, expected world labels after recovery)
    "d_transaction_before_commit": ("before_transaction_commit:2", "refunds", None),
}


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_crash_matrix(database_url: str, subprocess_env: dict[str, str], cell: str) -> None:
    crash, which, expected = CELLS[cell]
    with client(database_url) as engine:
        if which == "three":
            handle = engine.submit(counter_app.three_steps, "w", workflow_id="w")
        else:
            orders = [["o1", 10], ["o2", 25], ["o3", 40]]
            handle = engine.submit(counter_app.refunds, "w", orders, workflow_id="w")
        first = start_worker(subprocess_env, database_url, crash=crash)
        assert first.wait(timeout=60) == -signal.SIGKILL
        second = start_worker(subprocess_env, database_url)
        try:
            result = handle.result(timeout=60)
        finally:
            stop_worker(second)
    labels = [what for _, what, _ in world(database_url, "w")]
    if which == "three":
        assert result == ["S1", "S2", "S3"]
        assert labels == expected
    else:
        assert result == 75
        # Each refund row exists exactly once although o2's transaction was cut off.
        rows = scalar(database_url, "SELECT array_agg(order_id ORDER BY id) FROM refunds")
        assert rows == ["o1", "o2", "o3"]
        # The cut-off attempt ran its body twice, but its write committed once.
        assert labels.count("refund-attempt:o2") == 2


def test_zombie_writes_nothing(database_url: str, subprocess_env: dict[str, str]) -> None:
    with client(database_url) as engine:
        handle = engine.submit(counter_app.slow, "z", 6, 0.4, workflow_id="z")
        zombie = start_worker(subprocess_env, database_url, lease=1.0)
        wait_for(lambda: len(world(database_url, "z")) >= 1, what="the first step")
        zombie.send_signal(signal.SIGSTOP)
        try:
            time.sleep(1.5)  # past the lease: the zombie's heartbeat is frozen too
            rescuer = start_worker(subprocess_env, database_url, lease=1.0)
            try:
                assert handle.result(timeout=60) == [f"s{i}" for i in range(6)]
            finally:
                stop_worker(rescuer)
            before = (
                scalar(database_url, "SELECT count(*) FROM durable.steps"),
                scalar(database_url, "SELECT epoch FROM durable.workflows"),
                scalar(database_url, "SELECT output FROM durable.workflows"),
            )
        finally:
            zombie.send_signal(signal.SIGCONT)
        time.sleep(1.5)  # let the zombie finish its in-flight step and try to record it
        after = (
            scalar(database_url, "SELECT count(*) FROM durable.steps"),
            scalar(database_url, "SELECT epoch FROM durable.workflows"),
            scalar(database_url, "SELECT output FROM durable.workflows"),
        )
        assert after == before
        assert engine.retrieve("z").status() == "SUCCESS"
        # The zombie ran at most the one step it was in when paused, and recorded nothing.
        zombie_rows = [r for r in world(database_url, "z") if r[2] == zombie.pid]
        assert 1 <= len(zombie_rows) <= 3
        stop_worker(zombie)


def test_max_recovery_attempts_then_resume(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    import subprocess
    import sys

    with client(database_url) as engine:
        handle = engine.submit(counter_app.three_steps, "m", workflow_id="m")
        # Every worker dies inside step 1: the workflow crashes its worker again and again.
        for _ in range(3):
            proc = start_worker(subprocess_env, database_url, crash="before_step:1", lease=0.5)
            proc.wait(timeout=60)
            time.sleep(0.6)
        # With max_recovery_attempts=2 (below), the next claim gives up on it.
        engine.runner.claims.config = dataclasses.replace(engine.config, max_recovery_attempts=2)
        # (recover() only sees it once the last worker's lease has expired)
        wait_for(
            lambda: engine.recover() == [] and handle.status() == "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
            timeout=30,
            what="the workflow to be given up",
        )
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "durable.cli",
                "workflows",
                "resume",
                "m",
                "--database-url",
                database_url,
            ],
            capture_output=True,
            text=True,
            env=subprocess_env,
            check=True,
        )
        assert "resumed" in out.stdout
        worker = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=60) == ["S1", "S2", "S3"]
        finally:
            stop_worker(worker)


def test_sigterm_releases_leases_for_an_immediate_takeover(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(counter_app.slow, "g", 8, 0.3, workflow_id="g")
        # A 60 s lease: without the release at shutdown, a takeover would wait a minute.
        first = start_worker(subprocess_env, database_url, lease=60.0, grace=0.1)
        wait_for(lambda: len(world(database_url, "g")) >= 1, what="the first step")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0  # clean exit
        assert handle.status() == "PENDING"  # released, not left RUNNING under a lease
        started = time.monotonic()
        second = start_worker(subprocess_env, database_url, lease=60.0)
        try:
            assert handle.result(timeout=30) == [f"s{i}" for i in range(8)]
        finally:
            stop_worker(second)
        assert time.monotonic() - started < 30


def test_a_restarted_worker_with_its_id_takes_its_workflows_back_at_once(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    """A worker restarted under the same --executor-id retakes what it was running well
    inside the lease (a third of it), where another worker would wait the lease out."""
    lease = 9.0
    ident = ["--executor-id", "worker-a"]
    with client(database_url) as engine:
        handle = engine.submit(counter_app.slow, "takeback", 3, 0.5, workflow_id="takeback")
    first = start_worker(subprocess_env, database_url, lease=lease, extra=ident)
    try:
        wait_for(lambda: len(world(database_url, "takeback")) >= 1, what="the first step")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed_at = time.monotonic()
        assert scalar(database_url, "SELECT owner FROM durable.workflows") == "worker-a"
        second = start_worker(subprocess_env, database_url, lease=lease, extra=ident)
        try:
            epoch = scalar(database_url, "SELECT epoch FROM durable.workflows")
            wait_for(
                lambda: scalar(database_url, "SELECT epoch FROM durable.workflows") != epoch,
                timeout=lease,
                what="the restarted worker's claim",
            )
            assert time.monotonic() - killed_at < lease / 3
            with durable.Client(database_url) as reader:
                assert reader.retrieve("takeback").result(timeout=30) == ["s0", "s1", "s2"]
                assert reader.get_workflow("takeback").recovery_attempts == 1
        finally:
            stop_worker(second)
    finally:
        stop_worker(first)
    assert handle.workflow_id == "takeback"
