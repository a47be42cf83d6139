"""The one interface every message source implements: what a trigger reads from a broker.

A source hands out deliveries, one per message, and is told what became of each: `ack`
once the workflow it starts is committed, `retry` when the start failed (the broker
delivers the message again later), `reject` when the message can never start one (it
cannot be decoded, or names no id): dead-lettered where the broker can, else dropped, and
logged either way. A source never decides; the consumer (`_consumer.py`) does, so every
broker gets the same order: receive, commit the workflow's row, then acknowledge.

RabbitMQ (`durable.triggers.rabbitmq`) and NATS JetStream (`durable.triggers.nats`)
implement it. A Kafka source would too: its deliveries are the records a consumer group
polls, `ack` commits the record's offset (after the row, never before: enable.auto.commit
off), `retry` seeks back to it, and `reject` produces the record to a dead-letter topic and
commits past it; the message id is `<topic>:<partition>:<offset>` or a key the user names.
No Kafka source ships, and none is claimed until one is tested against a Kafka broker.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durable._io.systemdb import SystemDB


@dataclass(frozen=True)
class Message:
    """One message as a broker delivered it.

    body: the payload, as bytes.
    id: the broker's id of the message, the same on every redelivery (RabbitMQ: the
      publisher's `message_id` property; NATS JetStream: the `Nats-Msg-Id` header, else the
      stream sequence), or None when the message carries none.
    headers: the message's headers, as text.
    subject: where it came from (the RabbitMQ queue, the NATS subject).
    redelivered: the broker says it delivered this message before.
    """

    body: bytes
    id: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    subject: str = ""
    redelivered: bool = False


class Delivery(abc.ABC):
    """A message received and not yet settled: exactly one of ack, retry or reject."""

    message: Message

    @abc.abstractmethod
    async def ack(self) -> None:
        """The workflow's row is committed: the broker may forget the message."""

    @abc.abstractmethod
    async def retry(self, delay: float) -> None:
        """The start failed for now (the database is away): deliver the message again, in
        about `delay` seconds where the broker can wait."""

    @abc.abstractmethod
    async def reject(self, reason: str) -> None:
        """The message can never start a workflow: dead-letter it (or drop it), never
        deliver it here again."""


class Source(abc.ABC):
    """Where a trigger's messages come from. `deliveries()` yields until the source is
    closed; a lost connection raises (the consumer opens the source again, backing off)."""

    @property
    @abc.abstractmethod
    def describe(self) -> str:
        """The source in a log line: broker, queue or subject (no credentials)."""

    def attach(self, db: SystemDB) -> None:  # noqa: B027 (most sources need no database)
        """Given the consuming engine's system database before `open` (the outbox's source
        reads it; a broker's source needs nothing)."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, and declare what the source needs (a queue, a consumer)."""

    @abc.abstractmethod
    def deliveries(self) -> AsyncIterator[Delivery]:
        """The messages, one delivery each, as they arrive."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Disconnect. Unsettled deliveries go back to the broker."""
