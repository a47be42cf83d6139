"""A stream's writer is SIGKILLed after 50 of 100 values and resumed by a worker in a fresh
process: a reader that was following across the kill and one that reconnects at offset 30
each see values 0..99 exactly once, in order. Both drivers, in one process: tests/
integration/test_twins_inprocess.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

import durable
from tests.acceptance.workers import scalar, stop_worker, wait_for

APP = "tests.apps.stream_app"


@pytest.mark.parametrize("driver", ["async"])
def test_readers_see_each_value_once_across_a_killed_writer(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    env = {**subprocess_env, "DURABLE_DATABASE_URL": database_url}
    workflow_id = f"stream-{driver}"
    seen_live: list[int] = []
    with durable.Client(database_url, migrate=True) as client:
        writer = subprocess.Popen(
            [sys.executable, "-m", APP, driver, workflow_id, "100"],
            env={**env, "DURABLE_CRASH_POINTS": "after_stream_write:50"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            lambda: scalar(
                database_url, "SELECT count(*) FROM durable.workflows WHERE workflow_id = %s",
                workflow_id,
            ) == 1,
            what="the workflow to exist",
        )  # fmt: skip

        def follow() -> None:
            for value in client.read_stream(workflow_id, "progress", poll_interval=0.2):
                seen_live.append(value["i"])

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert writer.wait(timeout=60) == -signal.SIGKILL
        written = scalar(
            database_url, "SELECT count(*) FROM durable.streams WHERE workflow_id = %s", workflow_id
        )
        assert written == 50
        worker = subprocess.Popen(
            [sys.executable, "-m", "durable.cli", "worker", "--app", APP,
             "--lease-seconds", "1", "--poll-interval", "0.1"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            reader.join(timeout=60)
            assert not reader.is_alive()
            again = [v["i"] for v in client.read_stream(workflow_id, "progress", offset=30)]
        finally:
            stop_worker(worker)
    assert seen_live == list(range(100))
    assert again == list(range(30, 100))
    offsets = scalar(
        database_url,
        'SELECT array_agg("offset" ORDER BY "offset") FROM durable.streams'
        " WHERE workflow_id = %s AND NOT closed",
        workflow_id,
    )
    assert offsets == list(range(100))  # each written once
