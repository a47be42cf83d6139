"""Event triggers: a workflow run once per message of a broker.

    from durable.triggers import RabbitMQ, on_message

    @on_message(RabbitMQ("orders"))
    @durable.workflow()
    def handle_order(order: dict) -> None: ...

`durable worker` consumes every registered trigger. Each message's workflow row is
committed before the message is acknowledged, under the id `trigger:<name>:<key>`, so a
redelivered message starts nothing new. Sources: `RabbitMQ` (extra `rabbitmq`),
`NatsJetStream` (extra `nats`), `PostgresOutbox` (a table of the system database the
application writes in its own transactions), or any `Source` subclass.
"""

from __future__ import annotations

from durable.triggers._consumer import Consumers
from durable.triggers._source import Delivery, Message, Source
from durable.triggers._trigger import (
    Trigger,
    body_hash,
    field,
    header,
    json_body,
    message_id,
    on_message,
    text_body,
)
from durable.triggers.nats import NatsJetStream
from durable.triggers.outbox import PostgresOutbox
from durable.triggers.rabbitmq import RabbitMQ

__all__ = [
    "Consumers",
    "Delivery",
    "Message",
    "NatsJetStream",
    "PostgresOutbox",
    "RabbitMQ",
    "Source",
    "Trigger",
    "body_hash",
    "field",
    "header",
    "json_body",
    "message_id",
    "on_message",
    "text_body",
]
