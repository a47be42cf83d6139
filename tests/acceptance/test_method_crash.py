"""A method workflow through real worker processes: the worker running `west.post` is
SIGKILLed after its second step, a fresh worker (a new process, whose import created its own
`east` and `west`) recovers it by the instance name the inputs stored, and the world table
shows that the steps done before the kill did not run again, that the transaction method
wrote once, and that every step ran with west's state (never east's). The async def twin
dies in one process: tests/integration/test_crash_inprocess.py."""

from __future__ import annotations

import json
import signal

import pytest

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, world
from tests.apps import counter_app, methods_app

APP = "tests.apps.methods_app"


@pytest.mark.parametrize("driver", ["sync"])
def test_a_killed_method_workflow_recovers_on_the_instance_of_its_name(
    database_url: str, subprocess_env: dict[str, str], driver: str
) -> None:
    counter_app.setup(database_url)
    workflow = methods_app.west.post if driver == "sync" else methods_app.west.post_async
    with durable.Client(database_url) as client:
        handle = client.submit(workflow, "w", 3, workflow_id="w")
        first = start_worker(
            subprocess_env, database_url, app=APP, crash="after_step_record:2", concurrency=1
        )
        try:
            assert first.wait(timeout=60) == -signal.SIGKILL
        finally:
            stop_worker(first)  # (only if it outlived the crash point)
        # Killed mid-workflow: two steps done (by the first worker), nothing after them.
        before = world(database_url, "w")
        assert [what for _, what, _ in before] == ["W0", "W1"]
        second = start_worker(subprocess_env, database_url, app=APP)
        try:
            assert handle.result(timeout=60) == ["W0", "W1", "W2", "W4"]
        finally:
            stop_worker(second)
    after = world(database_url, "w")
    # Each step and the transaction ran once, all with west's prefix; the fresh process ran
    # only what came after the kill.
    assert [what for _, what, _ in after] == ["W0", "W1", "W2", "Wmark3", "W4"]
    first_pid = before[0][2]
    assert {pid for _, _, pid in after[:2]} == {first_pid}
    assert first_pid not in {pid for _, _, pid in after[2:]}
    assert scalar(database_url, "SELECT count(*) FROM marks WHERE workflow_id = 'w'") == 1
    # The stored inputs name the instance; they do not hold it.
    inputs = scalar(database_url, "SELECT inputs FROM durable.workflows WHERE workflow_id = 'w'")
    assert json.loads(str(inputs)) == {
        "args": ["w", 3],
        "kwargs": {},
        "receiver": {"class": "Ledger", "instance": "west"},
    }
