"""Durable sleep and messages across SIGKILLed workers. One real process per scenario;
both drivers, in one process: tests/integration/test_twins_inprocess.py (a dead process)
and tests/integration/test_conformance.py (the same operations and rows)."""

from __future__ import annotations

import datetime as dt
import signal
import time
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from tests.acceptance.workers import client, scalar, start_worker, stop_worker, wait_for
from tests.apps import counter_app


def world_at(url: str, workflow_id: str) -> list[tuple[str, dt.datetime]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1])
            for r in conn.execute(
                "SELECT what, at FROM world WHERE workflow_id = %s ORDER BY id", [workflow_id]
            )
        ]


@pytest.mark.parametrize("driver", ["async"])
def test_sleep_survives_worker_death_and_wakes_once_on_time(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(
            counter_app.pick(counter_app.napper, driver), "nap", 3.0, workflow_id="nap"
        )
        first = start_worker(subprocess_env, database_url)
        wait_for(lambda: handle.status() == "SUSPENDED", what="the sleep to suspend")
        # Sleeping holds nothing; the worker dies while it sleeps.
        assert scalar(database_url, "SELECT owner FROM durable.workflows") is None
        first.send_signal(signal.SIGKILL)
        first.wait()
        wake_at = scalar(database_url, "SELECT wake_at FROM durable.workflows")
        assert isinstance(wake_at, dt.datetime)
        second = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=60) == "AFTER"
        finally:
            stop_worker(second)
    rows = world_at(database_url, "nap")
    assert [w for w, _ in rows] == ["before", "after"]  # each once
    assert rows[1][1] >= wake_at  # not before it was due
    assert rows[1][1] - wake_at < dt.timedelta(seconds=10)  # and promptly after


@pytest.mark.parametrize("driver", ["sync"])
def test_messages_consumed_exactly_once_across_a_crash(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(
            counter_app.pick(counter_app.receiver, driver), "rx", 3, workflow_id="rx"
        )
        # The receiver dies right after consuming (and journaling) the second message.
        first = start_worker(subprocess_env, database_url, crash="after_recv:2")
        wait_for(lambda: handle.status() == "SUSPENDED", what="the receiver to wait")
        engine.send("rx", "m1", topic="orders", idempotency_key="k1")
        engine.send("rx", "m1", topic="orders", idempotency_key="k1")  # duplicate: once
        time.sleep(0.3)
        engine.send("rx", "m2", topic="orders", idempotency_key="k2")
        assert first.wait(timeout=60) == -signal.SIGKILL
        engine.send("rx", "m3", topic="orders", idempotency_key="k3")
        second = start_worker(subprocess_env, database_url)
        try:
            assert handle.result(timeout=60) == ["m1", "m2", "m3"]
        finally:
            stop_worker(second)
    assert scalar(database_url, "SELECT count(*) FROM durable.messages") == 3
    seqs = scalar(
        database_url, "SELECT array_agg(consumed_seq ORDER BY created_at) FROM durable.messages"
    )
    assert seqs is not None and len(set(seqs)) == 3  # type: ignore[arg-type]


@pytest.mark.parametrize("driver", ["sync"])
def test_recv_timeout_and_bad_input(database_url: str, driver: str) -> None:
    reg = durable.Registry()
    waits: Any
    bad_sleep: Any
    if driver == "sync":

        @durable.workflow(registry=reg, name="waits")
        def waits() -> object:
            return durable.recv("nothing", timeout=0.2)

        @durable.workflow(registry=reg, name="bad_sleep")
        def bad_sleep() -> None:
            durable.sleep(-1)

    else:

        @durable.workflow(registry=reg, name="waits")
        async def waits() -> object:
            return await durable.recv_async("nothing", timeout=0.2)

        @durable.workflow(registry=reg, name="bad_sleep")
        async def bad_sleep() -> None:
            await durable.sleep_async(-1)

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        assert engine.start(waits, workflow_id="t").result(timeout=20) is None
        with pytest.raises(errors.WorkflowFailedError) as info:
            engine.start(bad_sleep, workflow_id="b").result(timeout=10)
        assert info.value.error_type == "durable.errors.InvalidWaitError"
        assert engine.steps("b") == []
        with pytest.raises(errors.WorkflowNotFoundError, match="workflows list"):
            engine.send("nobody", "hi")
        assert scalar(database_url, "SELECT count(*) FROM durable.messages") == 0


@pytest.mark.parametrize("driver", ["sync"])
def test_events_and_cli_send(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    import json
    import subprocess
    import sys

    reg = durable.Registry()
    publisher: Any
    if driver == "sync":

        @durable.workflow(registry=reg, name="publisher")
        def publisher() -> object:
            durable.set_event("stage", "waiting")
            message = durable.recv()
            durable.set_event("stage", f"got {message['n']}")
            return message

    else:

        @durable.workflow(registry=reg, name="publisher")
        async def publisher() -> object:
            await durable.set_event_async("stage", "waiting")
            message = await durable.recv_async()
            await durable.set_event_async("stage", f"got {message['n']}")
            return message

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.submit(publisher, workflow_id="pub")
        assert engine.get_event("pub", "stage", timeout=10) == "waiting"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "durable.cli",
                "send",
                "pub",
                json.dumps({"n": 7}),
                "--key",
                "once",
                "--database-url",
                database_url,
            ],
            capture_output=True,
            text=True,
            env=subprocess_env,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert handle.result(timeout=20) == {"n": 7}
        assert engine.get_event("pub", "stage") == "got 7"
        assert engine.get_event("pub", "missing", timeout=0.1) is None
        kinds = [s.kind for s in engine.steps("pub")]
        assert kinds == ["event", "recv", "event"]
