"""NATS JetStream as a trigger's source (`pip install 'durable-pg[nats]'`: nats-py).

A durable pull consumer of the stream reads the subject. A message is acknowledged
(`+ACK`, confirmed by the server) only after its workflow's row is committed; a start that
failed for now is handed back (`-NAK`, redelivered after the delay); a bad message is
terminated (`+TERM`, never redelivered), after a copy is published to
`dead_letter_subject` when one is given. A message a crashed consumer never acknowledged is
delivered again once `ack_wait` has passed.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from durable._base.extras import extra
from durable._base.names import check_name
from durable._base.urls import redact
from durable.errors import DefinitionError
from durable.triggers._source import Delivery, Message, Source

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

MSG_ID_HEADER = "Nats-Msg-Id"


class _NatsDelivery(Delivery):
    def __init__(self, msg: Msg, source: NatsJetStream) -> None:
        self._msg = msg
        self._source = source
        headers = dict(msg.headers or {})
        meta = msg.metadata
        self.message = Message(
            body=msg.data,
            id=headers.get(MSG_ID_HEADER) or str(meta.sequence.stream),
            headers=headers,
            subject=msg.subject,
            redelivered=meta.num_delivered > 1,
        )

    async def ack(self) -> None:
        await self._msg.ack_sync()

    async def retry(self, delay: float) -> None:
        await self._msg.nak(delay=delay)

    async def reject(self, reason: str) -> None:
        await self._source.dead_letter(self._msg, reason)
        await self._msg.term()


class NatsJetStream(Source):
    """Consume `subject` of the JetStream stream `stream` with a durable pull consumer.

    url: the server (default nats://127.0.0.1:4222).
    consumer: the durable consumer's name (default: made of the stream and subject); every
      worker consuming the trigger shares it, so each message goes to one of them.
    create_stream: create the stream (on `subject`) if it does not exist (default True).
    ack_wait: seconds a delivered message waits for its acknowledgement before it is
      delivered again, e.g. to another worker after a crash (default 30).
    batch: messages fetched at once (default 16).
    dead_letter_subject: where a copy of each rejected message is published (with the
      header Durable-Rejected giving the reason) before it is terminated; None (default):
      terminated and logged only.
    The message id (the default key) is its `Nats-Msg-Id` header, else its stream sequence.
    """

    def __init__(
        self,
        stream: str,
        subject: str,
        *,
        url: str = "nats://127.0.0.1:4222",
        consumer: str | None = None,
        create_stream: bool = True,
        ack_wait: float = 30.0,
        batch: int = 16,
        dead_letter_subject: str | None = None,
    ) -> None:
        check_name("stream", stream)
        check_name("subject", subject)
        check_name("consumer", consumer, optional=True)
        check_name("dead_letter_subject", dead_letter_subject, optional=True)
        if batch < 1 or not ack_wait > 0:
            raise DefinitionError(
                f"NatsJetStream(batch={batch}, ack_wait={ack_wait}): give a batch of 1 or "
                "more and an ack_wait above 0 seconds"
            )
        self.stream = stream
        self.subject = subject
        self.url = url
        self.consumer = consumer or re.sub(r"[^A-Za-z0-9_-]", "_", f"durable-{stream}-{subject}")
        self.create_stream = create_stream
        self.ack_wait = ack_wait
        self.batch = batch
        self.dead_letter_subject = dead_letter_subject
        self._nc: NatsClient | None = None
        self._sub: JetStreamContext.PullSubscription | None = None

    @property
    def describe(self) -> str:
        return f"NATS JetStream {self.stream}/{self.subject} at {redact(self.url)}"

    async def open(self) -> None:
        with extra("nats"):
            import nats
            from nats.js.api import AckPolicy, ConsumerConfig
            from nats.js.errors import NotFoundError
        self._nc = nc = await nats.connect(
            self.url, allow_reconnect=False, connect_timeout=5, max_reconnect_attempts=0
        )
        js = nc.jetstream()
        if self.create_stream:
            try:
                await js.stream_info(self.stream)
            except NotFoundError:
                await js.add_stream(name=self.stream, subjects=[self.subject])
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait)
        self._sub = await js.pull_subscribe(
            self.subject, durable=self.consumer, stream=self.stream, config=config
        )

    async def deliveries(self) -> AsyncIterator[Delivery]:
        with extra("nats"):
            from nats.errors import TimeoutError as FetchTimeout
        sub, nc = self._sub, self._nc
        assert sub is not None and nc is not None, "open() first"
        while True:
            if nc.is_closed:
                raise ConnectionError("the connection to NATS closed")
            try:
                msgs = await sub.fetch(self.batch, timeout=1.0)
            except FetchTimeout:
                continue
            for msg in msgs:
                yield _NatsDelivery(msg, self)

    async def dead_letter(self, msg: Msg, reason: str) -> None:
        if self.dead_letter_subject is None or self._nc is None:
            return
        headers: dict[str, Any] = {**(msg.headers or {}), "Durable-Rejected": reason[:1000]}
        await self._nc.publish(self.dead_letter_subject, msg.data, headers=headers)
        await self._nc.flush()

    async def close(self) -> None:
        nc, self._nc, self._sub = self._nc, None, None
        if nc is not None and not nc.is_closed:
            await nc.close()
