"""durable.send from workflow code, through real worker processes: a worker is SIGKILLed
between a message's delivery and its journal row, a fresh worker recovers the sender, and
the receiver gets every message exactly once (the messages table and its result say so)."""

from __future__ import annotations

import signal

import psycopg

import durable
from tests.acceptance.workers import start_worker, stop_worker, world
from tests.apps import counter_app, messaging_app

APP = "tests.apps.messaging_app"


def test_a_send_cut_off_before_its_journal_row_delivers_once(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    counter_app.setup(database_url)
    with durable.Client(database_url) as client:
        received = client.submit(messaging_app.receiver, 3, workflow_id="receiver")
        sent = client.submit(messaging_app.sender, "receiver", 3, workflow_id="sender")
        # The second message is delivered, then the worker dies before journaling it.
        first = start_worker(subprocess_env, database_url, app=APP, crash="after_send_message:2")
        assert first.wait(timeout=60) == -signal.SIGKILL
        second = start_worker(subprocess_env, database_url, app=APP)
        try:
            assert sent.result(timeout=60) == 3
            assert received.result(timeout=60) == ["m0", "m1", "m2"]
        finally:
            stop_worker(second)
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT message_id, payload FROM durable.messages WHERE workflow_id = 'receiver'"
            " ORDER BY created_at"
        ).fetchall()
    assert [payload for _, payload in rows] == ['"m0"', '"m1"', '"m2"']  # none twice
    # Derived from the sender's position and incarnation (journal version 2): the same on
    # the run after the crash, so the message cut off before its journal row is not new.
    ids = [message_id for message_id, _ in rows]
    incarnation = ids[0].rpartition("@")[2]
    assert ids == [f"sender:send:{i}@{incarnation}" for i in (0, 2, 4)]
    # The sender's body ran its second send twice (once before the kill), its note once.
    assert [what for _, what, _ in world(database_url, "sender")] == [
        "sent m0",
        "sent m1",
        "sent m2",
    ]
