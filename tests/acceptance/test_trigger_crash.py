"""A trigger's consumer SIGKILLed between receiving a message and acknowledging it.

For each broker (and the PostgreSQL outbox), the worker consuming the trigger dies at the
second message: (a) before that message's workflow row is committed, (b) after the row is
committed and before the message is acknowledged. A fresh worker then consumes the rest.
The world must show every published message run exactly once: one workflow per message in
the workflows table, one count per message in `trigger_hits` (counted by a @transaction
step, in the transaction of its journal row), and nothing left unacknowledged.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import psycopg
import pytest

from durable._base import labels
from tests import brokers
from tests.acceptance.workers import start_worker, stop_worker, wait_for
from tests.apps import trigger_app

APP = "tests.apps.trigger_app"
MESSAGES = [f"m-{i}" for i in range(4)]


@pytest.fixture(params=["rabbitmq", "nats", "outbox"])
def broker(
    request: pytest.FixtureRequest, database_url: str
) -> Iterator[tuple[str, str, Callable[[], int]]]:
    """(broker, a unique name, how many messages it still holds unacknowledged)."""
    kind: str = request.param
    name = brokers.unique(f"durable_trig_{kind}")
    if kind == "outbox":  # the system database's own table: written in the app's transaction
        outbox = trigger_app.source("outbox", name)
        with psycopg.connect(database_url) as conn:
            for m in MESSAGES:
                outbox.write(conn, m, {"msg": m})  # type: ignore[attr-defined]
        yield kind, name, lambda: _outbox_rows(database_url, name)
        return
    request.getfixturevalue(f"{kind}_url")  # skips when the broker is not there
    if kind == "rabbitmq":
        brokers.rabbit_publish(name, [(m, brokers.body(m)) for m in MESSAGES])
        yield kind, name, lambda: brokers.rabbit_count(name)
        brokers.rabbit_delete(name)
    else:
        subject = f"{name}.in"
        brokers.nats_publish(name, subject, [(m, brokers.body(m)) for m in MESSAGES])
        consumer = trigger_app.source("nats", name).consumer  # type: ignore[attr-defined]
        yield kind, name, lambda: brokers.nats_pending(name, consumer)
        brokers.nats_delete(name)


def _workflows(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, status FROM durable.workflows"
            " WHERE workflow_id LIKE 'trigger:%' ORDER BY workflow_id"
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _outbox_rows(url: str, topic: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM durable.trigger_outbox WHERE topic = %s", [topic])
        return int(row.fetchone()[0])  # type: ignore[index]


def _hits(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT msg, n FROM trigger_hits").fetchall())


@pytest.mark.parametrize(
    ("crash", "committed"),
    [("trigger_before_commit:2", 1), ("trigger_before_ack:2", 2)],
    ids=["before-commit", "before-ack"],
)
def test_a_consumer_killed_before_its_ack_loses_and_duplicates_no_run(
    database_url: str,
    subprocess_env: dict[str, str],
    broker: tuple[str, str, Callable[[], int]],
    crash: str,
    committed: int,
) -> None:
    kind, name, unacknowledged = broker
    trigger_app.setup(database_url)
    env = {**subprocess_env, "TRIGGER_BROKER": kind, "TRIGGER_NAME": name}
    first = start_worker(env, database_url, app=APP, crash=crash)
    assert first.wait(timeout=60) == -signal.SIGKILL
    # Where it died: the second message's row not yet committed (a), or committed (b).
    assert len(_workflows(database_url)) == committed
    second = start_worker(env, database_url, app=APP)
    expected = [(labels.trigger_message_id("t", m), "SUCCESS") for m in MESSAGES]
    try:
        wait_for(lambda: _workflows(database_url) == expected, what="a run per message")
        wait_for(lambda: unacknowledged() == 0, what="every message acknowledged")
    finally:
        stop_worker(second)
    assert _workflows(database_url) == expected  # one workflow per message, no other
    assert _hits(database_url) == dict.fromkeys(MESSAGES, 1)  # each message ran once
    assert unacknowledged() == 0
