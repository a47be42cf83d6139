"""A workflow's own recovery limit (`@durable.workflow(max_recovery_attempts=N)`): checked
when the function is decorated, stored on the workflow's row when it starts, and honoured
by every claim, whatever the claiming worker's code and engine say. (With real worker
processes SIGKILLed: tests/acceptance/test_recovery_limit.py.)"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import durable
from durable import errors


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_the_limit_is_checked_at_decoration(bad: Any) -> None:
    reg = durable.Registry()
    with pytest.raises(errors.DefinitionError, match=r"max_recovery_attempts=.*whole number"):
        durable.workflow(max_recovery_attempts=bad, registry=reg)
    assert reg.workflows() == []


def stored_limit(database_url: str, workflow_id: str) -> object:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT max_recovery_attempts FROM durable.workflows WHERE workflow_id = %s",
            (workflow_id,),
        ).fetchone()
    assert row is not None
    return row[0]


def test_the_limit_stored_at_start_is_honoured_by_a_worker_whose_code_says_otherwise(
    database_url: str,
) -> None:
    # The code that starts it: a limit of 1.
    starting = durable.Registry()

    @durable.workflow(registry=starting, name="job", max_recovery_attempts=1)
    def job_started() -> str: ...

    @durable.workflow(registry=starting, name="plain")
    def plain() -> None: ...

    # The code the workers run (another deploy): no limit of its own, the engine's 10.
    running = durable.Registry()
    gate, runs = threading.Event(), []

    @durable.step(registry=running, name="hang")
    def hang() -> str:
        runs.append("hang")
        assert gate.wait(10), "the test never released the gate"
        return "done"

    @durable.workflow(registry=running, name="job")
    def job_run() -> str:
        return hang()

    def crashing_engine() -> durable.Engine:
        return durable.Engine(database_url, registry=running, lease_seconds=0.3, max_workers=1)

    with durable.Client(database_url) as client:
        handle = client.submit(job_started, workflow_id="m")
        client.submit(plain, workflow_id="p")
        assert (stored_limit(database_url, "m"), stored_limit(database_url, "p")) == (1, None)
        zombies = []
        try:
            # The first claim runs it; the second is its one recovery.
            for attempt in (1, 2):
                engine = crashing_engine()
                engine.launch()
                zombies.append(engine)
                assert [h.workflow_id for h in engine.recover()] == ["m"]
                deadline = time.monotonic() + 10
                while runs.count("hang") < attempt and time.monotonic() < deadline:
                    time.sleep(0.02)
                engine.shutdown(wait=False)  # heartbeat stops, the lease is not released
                time.sleep(0.5)  # past the lease
            assert runs == ["hang", "hang"]
            # The next claim gives up, although this engine would allow 10.
            with crashing_engine() as third:
                assert third.config.max_recovery_attempts == 10
                assert third.recover() == []
            assert handle.status() is durable.WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED
            # A fork keeps the limit; a resume keeps it too.
            fork = client.fork("m", from_step=0, new_id="m2")
            assert stored_limit(database_url, fork.workflow_id) == 1
            client.resume("m")
            assert stored_limit(database_url, "m") == 1
        finally:
            gate.set()
        with durable.Engine(database_url, registry=running, worker=True, poll_interval=0.05):
            assert handle.result(timeout=10) == "done"
