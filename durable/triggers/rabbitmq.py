"""RabbitMQ as a trigger's source (`pip install 'durable-pg[rabbitmq]'`: aio-pika).

A message is acknowledged (`basic.ack`) only after its workflow's row is committed; a
start that failed for now is handed back (`basic.nack`, requeued); a bad message is
rejected without requeue, which RabbitMQ dead-letters when the queue has a dead-letter
exchange (`dead_letter_queue=` declares one), and drops otherwise. Unacknowledged messages
of a consumer whose connection is gone (a crash) are delivered again at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from durable._base.extras import extra
from durable._base.names import check_name
from durable._base.urls import redact
from durable.errors import DefinitionError
from durable.triggers._source import Delivery, Message, Source

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection, AbstractIncomingMessage, AbstractQueue


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _RabbitDelivery(Delivery):
    def __init__(self, incoming: AbstractIncomingMessage, queue: str) -> None:
        self._incoming = incoming
        self.message = Message(
            body=incoming.body,
            id=incoming.message_id or None,
            headers={k: _text(v) for k, v in (incoming.headers or {}).items()},
            subject=queue,
            redelivered=bool(incoming.redelivered),
        )

    async def ack(self) -> None:
        await self._incoming.ack()

    async def retry(self, delay: float) -> None:
        await self._incoming.nack(requeue=True)

    async def reject(self, reason: str) -> None:
        await self._incoming.reject(requeue=False)


class RabbitMQ(Source):
    """Consume the RabbitMQ queue `queue`.

    url: the broker (default amqp://guest:guest@127.0.0.1:5672/).
    prefetch: messages delivered ahead of their acknowledgement (default 16).
    declare: declare the queue (durable) if it does not exist (default True); False
      expects it declared already, with whatever arguments it was given.
    dead_letter_queue: a queue for the rejected messages: declared, and named as the
      queue's dead-letter route (the queue must be new, or already declared so: RabbitMQ
      refuses to change a queue's arguments). None (default): a rejected message goes
      where the queue's own dead-letter exchange says, or is dropped (and logged).
    The message id (the default key) is the publisher's `message_id` property. Some
    clients (aio-pika) give each publish a random one when the application sets none: a
    message the application publishes twice is then two runs. Set message_id when
    publishing, or name a key (`key=field("order_id")`).
    """

    def __init__(
        self,
        queue: str,
        *,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        prefetch: int = 16,
        declare: bool = True,
        dead_letter_queue: str | None = None,
    ) -> None:
        check_name("queue", queue)
        check_name("dead_letter_queue", dead_letter_queue, optional=True)
        if prefetch < 1:
            raise DefinitionError(f"RabbitMQ(prefetch={prefetch}): give 1 or more")
        if dead_letter_queue is not None and not declare:
            raise DefinitionError(
                "RabbitMQ(dead_letter_queue=..., declare=False): a dead-letter route is "
                "declared with the queue; declare it yourself, or let the queue be declared"
            )
        self.queue = queue
        self.url = url
        self.prefetch = prefetch
        self.declare = declare
        self.dead_letter_queue = dead_letter_queue
        self._connection: AbstractConnection | None = None
        self._queue: AbstractQueue | None = None

    @property
    def describe(self) -> str:
        return f"RabbitMQ queue {self.queue!r} at {redact(self.url)}"

    async def open(self) -> None:
        with extra("rabbitmq"):
            import aio_pika
        self._connection = connection = await aio_pika.connect(self.url, timeout=10)
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        if not self.declare:
            self._queue = await channel.declare_queue(self.queue, passive=True)
            return
        arguments: dict[str, Any] = {}
        if self.dead_letter_queue is not None:
            await channel.declare_queue(self.dead_letter_queue, durable=True)
            arguments = {
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.dead_letter_queue,
            }
        self._queue = await channel.declare_queue(
            self.queue, durable=True, arguments=arguments or None
        )

    async def deliveries(self) -> AsyncIterator[Delivery]:
        assert self._queue is not None, "open() first"
        async with self._queue.iterator() as incoming:
            async for message in incoming:
                yield _RabbitDelivery(message, self.queue)

    async def close(self) -> None:
        connection, self._connection, self._queue = self._connection, None, None
        if connection is not None:
            await connection.close()
