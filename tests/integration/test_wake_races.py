"""A message or a decision that lands while its workflow is suspending is never lost.

The interleaving that loses it: the sender's statement locks the RUNNING row first; the
suspension starts (its snapshot cannot see the sender's uncommitted message), waits for the
row, and suspends once the sender commits. The protocol's answer is a second look right
after every suspension on a topic or a gate (`wake_if_message`, `wake_if_decided`): these
tests run the library's own statements in exactly that order, then that second look."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

import durable
from durable._io.systemdb import load_queries

reg = durable.Registry()


@durable.workflow(registry=reg, name="races.receiver")
def receiver() -> str:
    return str(durable.recv("t"))


def _queries() -> dict[str, str]:
    return {k: v.replace("{schema}", '"durable"') for k, v in load_queries().items()}


def _running(url: str, workflow_id: str) -> None:
    with durable.Client(url) as client:
        client.submit(receiver, workflow_id=workflow_id)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = 'x', epoch = 1,"
            " lease_expires_at = now() + interval '1 minute' WHERE workflow_id = %s",
            [workflow_id],
        )


def _interleave(url: str, sender_sql: str, sender: dict[str, Any], suspend_sql: str,
                suspend: dict[str, Any]) -> int:  # fmt: skip
    """The sender locks the row and waits to commit while the suspension starts."""
    rows: dict[str, int] = {}
    with psycopg.connect(url) as locking:  # not autocommit: its commit comes later
        locking.execute(sender_sql, sender)

        def suspending() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                rows["n"] = conn.execute(suspend_sql, suspend).rowcount

        thread = threading.Thread(target=suspending)
        thread.start()
        time.sleep(0.5)  # the suspension has its snapshot and waits for the row
        locking.commit()
        thread.join(timeout=10)
    return rows["n"]


def _status(url: str, workflow_id: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = %s", [workflow_id]
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_a_message_sent_while_the_row_is_locked_still_wakes_the_receiver(
    database_url: str,
) -> None:
    q = _queries()
    _running(database_url, "r1")
    message = {
        "workflow_id": "r1",
        "message_id": "m1",
        "topic": "t",
        "payload": '"hi"',
        "sender_id": None,
        "sender_seq": None,
    }
    suspend = {"workflow_id": "r1", "epoch": 1, "wake_at": None, "topic": "t"}
    assert _interleave(database_url, q["send_message"], message, q["suspend_until"], suspend)
    assert _status(database_url, "r1") == "SUSPENDED"  # the race, as PostgreSQL runs it
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(q["wake_if_message"], {"workflow_id": "r1", "topic": "t"})
    assert _status(database_url, "r1") == "PENDING"
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        assert engine.retrieve("r1").result(timeout=20) == "hi"


def test_a_decision_made_while_the_row_is_locked_still_wakes_the_gate(database_url: str) -> None:
    q = _queries()
    _running(database_url, "g1")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            q["approval_request"],
            {
                "workflow_id": "g1",
                "name": "ship",
                "epoch": 1,
                "step_seq": 0,
                "payload": "null",
                "default_approved": False,
                "timeout_seconds": None,
            },
        )
    decide = {
        "workflow_id": "g1",
        "name": "ship",
        "status": "approved",
        "comment": None,
        "decided_by": "ops",
    }
    suspend = {"workflow_id": "g1", "name": "ship", "epoch": 1}
    assert _interleave(
        database_url, q["decide_approval"], decide, q["suspend_for_approval"], suspend
    )
    assert _status(database_url, "g1") == "SUSPENDED"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(q["wake_if_decided"], {"workflow_id": "g1", "name": "ship"})
    assert _status(database_url, "g1") == "PENDING"


gate_entered = threading.Event()
gate_open = threading.Event()


@durable.step(registry=reg, name="races.gate")
def gate() -> None:
    gate_entered.set()
    gate_open.wait(20)


@durable.workflow(registry=reg, name="races.waits_after_a_step")
def waits_after_a_step() -> str:
    gate()
    return str(durable.recv("go", timeout=600))


def test_a_cancel_that_lands_while_the_run_suspends_still_stops_it(database_url: str) -> None:
    # The cancel is written while the run is between its last look at cancel requests and
    # its suspension: the suspension must not park a cancelled workflow for good.
    gate_entered.clear()
    gate_open.clear()
    with durable.Engine(database_url, registry=reg) as engine:
        # The run does not hear of the cancel itself.
        engine._services.heartbeat.cancel_poll_interval = 60.0
        handle = engine.start(waits_after_a_step, workflow_id="cancel-race")
        assert gate_entered.wait(10)
        with psycopg.connect(database_url) as conn:
            # Hold the row while asking, as a cancel racing the run's journal write does.
            conn.execute(
                "UPDATE durable.workflows SET cancel_reason = 'the user left'"
                " WHERE workflow_id = 'cancel-race'"
            )
            gate_open.set()
            time.sleep(0.3)  # the run's record of the step waits for this commit
        try:
            handle.result(timeout=20)
        except durable.errors.WorkflowCancelledError:
            pass
        assert engine.retrieve("cancel-race").status() == "CANCELLED"
