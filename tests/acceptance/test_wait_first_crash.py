"""durable.wait_first through real worker processes, both drivers: a worker is SIGKILLed
while the agent waits for the first of an approval, a message and a day, a message arrives
with no worker alive, the next worker is SIGKILLed right after journaling that win, and
the approval is decided before a fresh worker recovers the agent. The replay keeps the
message as the winner (though the approval, listed first, is decided by then), every
message and the approval are consumed once, and the steps after the win ran once (the
world table and the messages table say so). The async def twin dies in one process:
tests/integration/test_crash_inprocess.py."""

from __future__ import annotations

import signal

import psycopg
import pytest

import durable
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for, world
from tests.apps import counter_app, waits_app

APP = "tests.apps.waits_app"


@pytest.mark.parametrize("asynchronous", [False], ids=["sync"])
def test_a_win_cut_off_by_a_crash_is_the_same_win_after_recovery(
    database_url: str, subprocess_env: dict[str, str], asynchronous: bool
) -> None:
    counter_app.setup(database_url)
    fn = waits_app.agent_async if asynchronous else waits_app.agent
    with durable.Client(database_url) as client:
        handle = client.submit(fn, "agent", workflow_id="agent")
        first = start_worker(subprocess_env, database_url, app=APP)
        try:
            wait_for(lambda: handle.status() == durable.WorkflowStatus.SUSPENDED, what="a park")
        finally:
            first.send_signal(signal.SIGKILL)  # killed while the agent waits
            first.wait(timeout=30)
        assert [w for _, w, _ in world(database_url, "agent")] == ["before"]

        client.send("agent", "hello", topic="chat")  # no worker alive: it only wakes it
        second = start_worker(subprocess_env, database_url, app=APP, crash="after_wait_first:1")
        assert second.wait(timeout=60) == -signal.SIGKILL  # right after the win's journal row
        # Decided before the replay: listed first, it would win a wait that looked again.
        client.decide("agent", "refund", True, decided_by="ops")
        client.send("agent", "later", topic="chat")

        third = start_worker(subprocess_env, database_url, app=APP)
        try:
            assert handle.result(timeout=60) == {
                "first": [1, "hello"],
                "second": [0, True],
                "later": "later",
            }
        finally:
            stop_worker(third)
    assert [w for _, w, _ in world(database_url, "agent")] == [
        "before",
        "won 1 hello",
        "won 0 True",
        "later later",
    ]
    with psycopg.connect(database_url) as conn:
        messages = conn.execute(
            "SELECT payload, consumed_seq FROM durable.messages WHERE workflow_id = 'agent'"
            " ORDER BY created_at"
        ).fetchall()
        steps = conn.execute(
            "SELECT step_seq, step_name FROM durable.steps WHERE workflow_id = 'agent'"
            " AND step_name LIKE 'wait-first%%' ORDER BY step_seq"
        ).fetchall()
    assert [m[0] for m in messages] == ['"hello"', '"later"']
    assert all(m[1] is not None for m in messages)  # each consumed, once, at one position
    assert len({m[1] for m in messages}) == 2
    assert [name for _, name in steps] == [
        "wait-first-timer",
        "wait-first#1 message:chat",
        "wait-first#0 approval:refund",
    ]
    assert scalar(database_url, "SELECT count(*) FROM durable.approvals") == 1
    assert scalar(database_url, "SELECT status FROM durable.approvals") == "approved"
