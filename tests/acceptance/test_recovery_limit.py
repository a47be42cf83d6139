"""A workflow's own recovery limit, with real worker processes SIGKILLed again and again:
`@durable.workflow(max_recovery_attempts=2)` gives up after its second recovery while a
workflow under the engine's limit (10) is still recovered, and it can be resumed."""

from __future__ import annotations

import subprocess
import sys
import time

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app
from tests.apps import recovery_limit_app as app

APP = "tests.apps.recovery_limit_app"
GAVE_UP = "MAX_RECOVERY_ATTEMPTS_EXCEEDED"


def test_a_workflows_own_limit_wins_over_the_engines_and_it_resumes(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    counter_app.setup(database_url)
    with durable.Engine(database_url, registry=app.registry, max_workers=1) as engine:
        own = engine.submit(app.own_limit, "own", workflow_id="own")
        default = engine.submit(app.engine_limit, "default", workflow_id="default")
        # Every worker dies before its first step: both crash their worker again and again.
        # The claim that finds `own` out of attempts gives up on it (and that worker may
        # still die in `default`).
        for _ in range(8):
            proc = start_worker(
                subprocess_env, database_url, crash="before_step:1", lease=0.5, app=APP
            )
            wait_for(lambda p=proc: p.poll() is not None or own.status() == GAVE_UP)
            stop_worker(proc)
            if own.status() == GAVE_UP:
                break
            time.sleep(0.6)  # past the dead worker's lease
        assert own.status() == GAVE_UP
        # Given up at the claim after its second recovery: two recoveries ran, no third.
        attempts = "SELECT recovery_attempts FROM durable.workflows WHERE workflow_id = %s"
        assert scalar(database_url, attempts, "own") == app.LIMIT + 1
        assert (
            scalar(database_url, "SELECT owner FROM durable.workflows WHERE workflow_id = 'own'")
            is None
        )
        assert default.status() in ("RUNNING", "PENDING")  # not given up: recovered again
        assert world(database_url) == []  # no step ever ran
        worker = start_worker(subprocess_env, database_url, app=APP)
        try:
            assert default.result(timeout=60) == ["S1", "S2", "S3"]
            assert own.status() == GAVE_UP  # a healthy worker leaves it to an operator
            out = subprocess.run(
                [sys.executable, "-m", "durable.cli", "workflows", "resume", "own"],
                capture_output=True,
                text=True,
                env={**subprocess_env, "DURABLE_DATABASE_URL": database_url},
                check=True,
            )
            assert "resumed" in out.stdout
            assert own.result(timeout=60) == ["S1", "S2", "S3"]
        finally:
            stop_worker(worker)
    assert scalar(database_url, attempts, "default") >= app.LIMIT + 1
    assert sorted(what for _, what, _ in world(database_url)) == sorted(["s1", "s2", "s3"] * 2)
