"""Triggers on real brokers (and the PostgreSQL outbox), consumed by an in-process worker:
the paths a crash test does not take. A bad message (not JSON, no key) goes to the
dead-letter place and the consumer goes on; a message delivered twice, or two messages of
one key, record one workflow; an outbox message exists only if its transaction commits."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy

import durable
from durable.triggers import NatsJetStream, PostgresOutbox, RabbitMQ, Source, field, on_message
from tests import brokers
from tests.acceptance.workers import wait_for


def _registry(source: Source, **options: Any) -> durable.Registry:
    reg = durable.Registry()

    @on_message(source, name="t", registry=reg, **options)
    @durable.workflow(registry=reg, name="triggers.echo")
    def echo(payload: dict[str, Any]) -> str:
        return str(payload["msg"])

    return reg


def _runs(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, output FROM durable.workflows WHERE status = 'SUCCESS'"
        ).fetchall()
    return {r[0]: r[1] for r in rows}


def test_rabbitmq_dead_letters_bad_messages_and_records_a_redelivery_once(
    database_url: str, rabbitmq_url: str
) -> None:
    queue = brokers.unique("durable_trig_it")
    dead = f"{queue}.dead"
    source = RabbitMQ(queue, url=rabbitmq_url, dead_letter_queue=dead)
    try:
        brokers.rabbit_publish(
            queue,
            [
                ("m-1", brokers.body("one")),
                ("m-1", brokers.body("one")),  # the publisher sent it twice
                ("bad", b"\xff not json"),
                ("m-2", brokers.body("two")),
            ],
            dead_letter_queue=dead,
        )
        reg = _registry(source)
        with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05):
            wait_for(lambda: len(_runs(database_url)) == 2, timeout=30, what="two runs")
            wait_for(lambda: brokers.rabbit_count(dead) == 1, timeout=30, what="a dead letter")
            wait_for(lambda: brokers.rabbit_count(queue) == 0, timeout=30, what="all acked")
        assert _runs(database_url) == {"trigger:t:m-1": '"one"', "trigger:t:m-2": '"two"'}
    finally:
        brokers.rabbit_delete(queue, dead)


def test_nats_dead_letters_bad_messages_and_one_key_is_one_run(
    database_url: str, nats_url: str
) -> None:
    stream = brokers.unique("durable_trig_it")
    subject, dead = f"{stream}.in", f"{stream}.dead"
    brokers.nats_publish(f"{stream}_dead", dead, [])  # a stream that keeps the dead letters
    source = NatsJetStream(stream, subject, url=nats_url, dead_letter_subject=dead)
    try:
        brokers.nats_publish(
            stream,
            subject,
            [
                ("a", brokers.body("one", order="o-1")),
                ("b", brokers.body("one again", order="o-1")),  # the same order: no new run
                ("c", b"\xff not json"),
                ("d", brokers.body("no order")),
                ("e", brokers.body("two", order="o-2")),
            ],
        )
        reg = _registry(source, key=field("order"))
        with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05):
            wait_for(lambda: len(_runs(database_url)) == 2, timeout=30, what="two runs")
            wait_for(
                lambda: brokers.nats_pending(stream, source.consumer) == 0,
                timeout=30,
                what="all settled",
            )
            wait_for(
                lambda: brokers.nats_stream_count(f"{stream}_dead") == 2,
                timeout=30,
                what="dead letters",
            )
        assert _runs(database_url) == {"trigger:t:o-1": '"one"', "trigger:t:o-2": '"two"'}
    finally:
        brokers.nats_delete(stream)
        brokers.nats_delete(f"{stream}_dead")


def test_an_outbox_message_runs_only_if_its_transaction_commits(database_url: str) -> None:
    outbox = PostgresOutbox(brokers.unique("orders"), poll_interval=0.2)
    reg = _registry(outbox, key=field("order"))
    app = sqlalchemy.create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(database_url)
    )
    try:
        with app.connect() as conn:  # the application's transaction, rolled back
            outbox.write(conn, "a", {"msg": "never", "order": "o-0"})
            conn.rollback()
        with app.begin() as conn:
            outbox.write(conn, "b", {"msg": "one", "order": "o-1"}, headers={"from": "shop"})
            outbox.write(conn, "c", {"msg": "no order"})  # no key: rejected, kept
        with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05):
            wait_for(lambda: len(_runs(database_url)) == 1, timeout=30, what="one run")
            with psycopg.connect(database_url) as raw:
                outbox.write(raw, "d", {"msg": "two", "order": "o-2"})  # while it consumes
            wait_for(lambda: len(_runs(database_url)) == 2, timeout=30, what="two runs")
            wait_for(lambda: len(_outbox(database_url)) == 1, timeout=30, what="acks")
    finally:
        app.dispose()
    assert _runs(database_url) == {"trigger:t:o-1": '"one"', "trigger:t:o-2": '"two"'}
    [(message_id, rejected)] = _outbox(database_url)
    assert message_id == "c"
    assert "no key" in rejected


def _outbox(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1])
            for r in conn.execute("SELECT message_id, rejected FROM durable.trigger_outbox")
        ]
