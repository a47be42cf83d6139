"""Triggers on real brokers, consumed by an in-process worker: the paths a crash test does
not take. A bad message (not JSON, no key) goes to the dead-letter place and the consumer
goes on; a message delivered twice, or two messages of one key, record one workflow."""

from __future__ import annotations

from typing import Any

import psycopg

import durable
from durable.triggers import NatsJetStream, RabbitMQ, Source, field, on_message
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
