"""An app for the trigger crash tests: one workflow run per broker message.

`durable worker --app tests.apps.trigger_app` consumes the source named by the environment:
TRIGGER_BROKER (rabbitmq, nats or outbox) and TRIGGER_NAME (the queue, or the stream and
subject `<name>.in`, unique per test). The workflow's one step is a @durable.transaction
that counts the message in `trigger_hits`, in the same transaction as its journal row: a
count above 1 means a message ran twice, a missing row that it was lost.
"""

from __future__ import annotations

import os

import psycopg
from sqlalchemy import Connection, text

import durable
from durable.triggers import NatsJetStream, PostgresOutbox, RabbitMQ, Source, on_message
from tests import brokers

registry = durable.Registry()

DDL = "CREATE TABLE IF NOT EXISTS trigger_hits (msg text PRIMARY KEY, n int NOT NULL)"


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)


@durable.transaction(registry=registry, name="trigger_app.count")
def count(conn: Connection, msg: str) -> int:
    row = conn.execute(
        text(
            "INSERT INTO trigger_hits (msg, n) VALUES (:m, 1)"
            " ON CONFLICT (msg) DO UPDATE SET n = trigger_hits.n + 1 RETURNING n"
        ),
        {"m": msg},
    ).one()
    return int(row[0])


@durable.workflow(registry=registry, name="trigger_app.handle")
def handle(payload: dict[str, str]) -> int:
    return count(payload["msg"])


def source(broker: str, name: str) -> Source:
    if broker == "rabbitmq":
        return RabbitMQ(name, url=brokers.RABBITMQ_URL, prefetch=4)
    if broker == "outbox":
        return PostgresOutbox(name, lease=1.0, batch=4, poll_interval=0.2)
    return NatsJetStream(name, f"{name}.in", url=brokers.NATS_URL, ack_wait=1.0, batch=4)


BROKER = os.environ.get("TRIGGER_BROKER")
if BROKER:
    on_message(source(BROKER, os.environ["TRIGGER_NAME"]), name="t", registry=registry)(handle)
