"""A pause outlives the worker that ran the paused run: judged by the world table, each
step runs once across a pause, a SIGKILL and an unpause on a fresh worker."""

from __future__ import annotations

import signal
import time

import durable
from tests.acceptance.workers import client, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app


def test_a_paused_run_whose_worker_was_killed_goes_on_once_on_a_fresh_worker(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    with client(database_url) as engine:
        handle = engine.submit(counter_app.slow, "k1", 5, 0.5, workflow_id="k1")
        worker = start_worker(subprocess_env, database_url)
        try:
            wait_for(lambda: len(world(database_url, "k1")) >= 1, what="the first step")
            # Asked from this process: the worker reads it from the database.
            with durable.Client(database_url) as operator:
                assert operator.pause("k1") == "RUNNING"
                wait_for(lambda: handle.status() == "PAUSED", what="the pause at a boundary")
            done = [w for _, w, _ in world(database_url, "k1")]
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
        finally:
            stop_worker(worker)
        assert 1 <= len(done) < 5  # stopped at a boundary, not after the last step
        fresh = start_worker(subprocess_env, database_url)
        try:
            time.sleep(1.5)  # a lease and more: the fresh worker takes nothing paused
            assert handle.status() == "PAUSED"
            assert [w for _, w, _ in world(database_url, "k1")] == done
            with durable.Client(database_url) as operator:
                assert operator.unpause("k1") == "PENDING"
            assert handle.result(timeout=60) == ["s0", "s1", "s2", "s3", "s4"]
        finally:
            stop_worker(fresh)
    assert [w for _, w, _ in world(database_url, "k1")] == ["s0", "s1", "s2", "s3", "s4"]
