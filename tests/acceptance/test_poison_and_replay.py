"""Poison pills and replays against real `durable worker` processes.

- Workflows whose stored inputs cannot be decoded end ERROR, once, while the worker
  process keeps running and finishes the workflows submitted before and after them.
- Schedules corrupted in the database are skipped; the others keep firing and the worker
  keeps running workflows.
- After a SIGKILL, a replay in a fresh process sees the same values, of the same types, as
  the first run saw (a dataclass argument, and steps returning a dataclass, a tuple, int
  keys, a set, a pydantic model, an enum and a dict that looks like a serializer tag).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import durable
from tests.acceptance.workers import scalar, stop_worker, wait_for
from tests.apps import poison_app, poison_cron_app

POISON_APP = "tests.apps.poison_app"
CRON_APP = "tests.apps.poison_cron_app"


class Workers:
    """Starts `durable worker` processes; whatever is still running at the end is killed."""

    def __init__(self, env: dict[str, str], url: str, log: Path) -> None:
        self.env = env
        self.url = url
        self.log = log
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, app: str, *, crash: str | None = None) -> subprocess.Popen[bytes]:
        child_env = {**self.env, "DURABLE_DATABASE_URL": self.url, "DURABLE_LOG_LEVEL": "WARNING"}
        if crash:
            child_env["DURABLE_CRASH_POINTS"] = crash
        with open(self.log, "ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durable.cli",
                    "worker",
                    "--app",
                    app,
                    "--lease-seconds",
                    "1",
                    "--poll-interval",
                    "0.1",
                    "--concurrency",
                    "4",
                    "--grace-seconds",
                    "5",
                ],
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append(proc)
        return proc

    def logged(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(database_url: str, subprocess_env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    started = Workers(subprocess_env, database_url, tmp_path / "worker.log")
    try:
        yield started
    finally:
        started.kill_all()


def rows(url: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, list(params)).fetchall()


def workflow(url: str, workflow_id: str) -> dict[str, Any]:
    found = rows(
        url,
        "SELECT status, error, epoch FROM durable.workflows WHERE workflow_id = %s",
        workflow_id,
    )
    assert found, workflow_id
    status, error, epoch = found[0]
    return {"status": status, "error": error, "epoch": epoch}


# -- poison pills ----------------------------------------------------------------------------------

CORRUPT = {
    "poison-tag-datetime": '{"args":[{"__durable__":"datetime","v":"garbage"}],"kwargs":{}}',
    "poison-tag-decimal": '{"args":[{"__durable__":"decimal","v":"x"}],"kwargs":{}}',
    "poison-not-json": "not JSON at all {",
    "poison-not-args": '{"value": 1}',
    "poison-list": "[1, 2, 3]",
}


def test_undecodable_inputs_end_error_and_the_worker_process_keeps_working(
    database_url: str, workers: Workers
) -> None:
    url = database_url
    with durable.Client(url) as client:
        before = [
            client.submit(poison_app.echo, poison_app.LOOKALIKE, workflow_id="before-1"),
            client.submit(poison_app.echo, {"n": 1}, workflow_id="before-2"),
        ]
        for workflow_id in CORRUPT:
            client.submit(poison_app.echo, 0, workflow_id=workflow_id)
        with psycopg.connect(url, autocommit=True) as conn:
            for workflow_id, inputs in CORRUPT.items():
                changed = conn.execute(
                    "UPDATE durable.workflows SET inputs = %s"
                    " WHERE workflow_id = %s AND status = 'PENDING'",
                    [inputs, workflow_id],
                )
                assert changed.rowcount == 1
        before.append(client.submit(poison_app.echo, [1, 2], workflow_id="before-3"))
        proc = workers.start(POISON_APP)
        try:
            assert before[0].result(timeout=30) == poison_app.LOOKALIKE
            assert before[1].result(timeout=30) == {"n": 1}
            assert before[2].result(timeout=30) == [1, 2]
            wait_for(
                lambda: all(workflow(url, w)["status"] == "ERROR" for w in CORRUPT),
                timeout=30,
                what="the poisoned workflows to end",
            )
            assert proc.poll() is None, workers.logged()
            # While the worker runs: another poisoned row, and workflows around it.
            after_1 = client.submit(poison_app.echo, poison_app.LOOKALIKE, workflow_id="after-1")
            assert after_1.result(timeout=30) == poison_app.LOOKALIKE
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO durable.workflows (workflow_id, name, status, inputs)"
                    " VALUES ('poison-raw', 'poison.echo', 'PENDING', %s)",
                    [CORRUPT["poison-tag-datetime"]],
                )
            after_2 = client.submit(poison_app.echo, "last", workflow_id="after-2")
            assert after_2.result(timeout=30) == "last"
            wait_for(
                lambda: workflow(url, "poison-raw")["status"] == "ERROR",
                timeout=30,
                what="the raw poisoned row to end",
            )
            assert proc.poll() is None, workers.logged()
        finally:
            code = stop_worker(proc)
    assert code == 0, workers.logged()
    for workflow_id in CORRUPT:
        stored = workflow(url, workflow_id)
        assert stored["status"] == "ERROR"
        assert '"type": "durable.errors.SerializationError"' in stored["error"]
        assert "cannot be started" in stored["error"]
        assert stored["epoch"] == 1  # claimed once, not again and again
    assert workflow(url, "poison-raw")["status"] == "ERROR"
    steps = "SELECT count(*) FROM durable.steps WHERE workflow_id LIKE %s"
    assert scalar(url, steps, "poison-%") == 0


def test_a_corrupt_schedule_is_skipped_and_the_worker_keeps_working(
    database_url: str, workers: Workers
) -> None:
    url = database_url

    def fired(schedule: str) -> int:
        return int(
            str(
                scalar(
                    url,
                    "SELECT count(*) FROM durable.workflows"
                    " WHERE workflow_id LIKE %s AND status = 'SUCCESS'",
                    f"schedule:{schedule}:%",
                )
            )
        )

    proc = workers.start(CRON_APP)
    try:
        wait_for(lambda: fired("cron.good") >= 1, timeout=30, what="the first tick")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable.schedules SET cron = 'not a cron'"
                " WHERE schedule_name = 'cron.bad_cron'"
            )
            conn.execute(
                "UPDATE durable.schedules SET timezone = 'Not/A_Zone'"
                " WHERE schedule_name = 'cron.bad_timezone'"
            )
        good = fired("cron.good")
        wait_for(lambda: fired("cron.good") >= good + 2, timeout=30, what="two more ticks")
        with durable.Client(url) as client:
            handle = client.submit(poison_cron_app.hello, "world")
            assert handle.result(timeout=30) == "hello world"
        assert proc.poll() is None, workers.logged()
    finally:
        code = stop_worker(proc)
    assert code == 0, workers.logged()
    # The corrupt schedules are left as they are (an operator fixes them), not rewritten.
    cron = "SELECT cron FROM durable.schedules WHERE schedule_name = %s"
    assert scalar(url, cron, "cron.bad_cron") == "not a cron"


# -- replay after a real crash ---------------------------------------------------------------------


def test_a_replay_after_sigkill_sees_the_same_values_and_types(
    database_url: str, workers: Workers
) -> None:
    url = database_url
    poison_app.setup(url)
    order = poison_app.Order("o-1", 250)
    with durable.Client(url) as client:
        handle = client.submit(poison_app.typed, "typed", order, workflow_id="typed")
        # Killed right after the last step's record: every step is journaled, the
        # workflow is not finished.
        crash = f"after_step_record:{poison_app.TYPED_STEPS}"
        first = workers.start(POISON_APP, crash=crash)
        assert first.wait(timeout=30) == -signal.SIGKILL, workers.logged()
        assert workflow(url, "typed")["status"] == "RUNNING"
        query = (
            "SELECT step_seq, step_name, output FROM durable.steps"
            " WHERE workflow_id = 'typed' ORDER BY step_seq"
        )
        journal = rows(url, query)
        assert len(journal) == poison_app.TYPED_STEPS
        second = workers.start(POISON_APP)
        try:
            assert handle.result(timeout=30) == poison_app.TYPED_RESULT
        finally:
            stop_worker(second)
    assert rows(url, query) == journal  # the replay ran no step again
    seen = rows(url, "SELECT pid, what, type, value FROM poison_seen ORDER BY id")
    first_run = [(what, kind, value) for pid, what, kind, value in seen if pid == first.pid]
    replay = [(what, kind, value) for pid, what, kind, value in seen if pid == second.pid]
    assert len(first_run) + len(replay) == len(seen)
    assert replay == first_run
    assert {what: kind for what, kind, _ in first_run} == {
        "input": "Order",
        "make_order": "Order",
        "pair": "tuple",
        "by_id": "dict",
        "ids": "set",
        "receipt": "Receipt",
        "color": "Color",
        "lookalike": "dict",
    }
    assert dict((what, value) for what, _, value in first_run)["by_id"] == repr(
        {250: "first", 251: "second"}
    )
