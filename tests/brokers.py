"""The message brokers some tests publish to: RabbitMQ and NATS JetStream on this machine.

A test that needs one takes the `rabbitmq_url` or `nats_url` fixture (tests/conftest.py):
it skips, saying how to get the broker, when nothing listens there, and fails under
CI=true. DURABLE_TEST_RABBITMQ_URL and DURABLE_TEST_NATS_URL point elsewhere. The helpers
publish and count with the same clients durable uses (aio-pika, nats-py).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

RABBITMQ_URL = os.environ.get("DURABLE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("DURABLE_TEST_NATS_URL", "nats://127.0.0.1:4222")


def unreachable(url: str, what: str, extra: str) -> str | None:
    """Why the broker at `url` cannot be used, or None."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 2):
            pass
    except OSError as exc:
        variable = f"DURABLE_TEST_{what.upper()}_URL"
        return (
            f"no {what} at {parts.hostname}:{parts.port} ({exc}): start one "
            f"(docker compose up -d {what.lower()}), or point {variable} at one"
        )
    try:
        __import__(extra)
    except ImportError:
        return f"{extra} is not installed: pip install -e '.[dev]'"
    return None


def _available(url: str, what: str, extra: str) -> str:
    why = unreachable(url, what, extra)
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {why}")
        pytest.skip(why)
    return url


@pytest.fixture
def rabbitmq_url() -> str:
    """RabbitMQ's URL (DURABLE_TEST_RABBITMQ_URL, else 127.0.0.1:5672 as guest)."""
    return _available(RABBITMQ_URL, "RabbitMQ", "aio_pika")


@pytest.fixture
def nats_url() -> str:
    """NATS's URL, with JetStream (DURABLE_TEST_NATS_URL, else 127.0.0.1:4222)."""
    return _available(NATS_URL, "NATS", "nats")


def unique(prefix: str) -> str:
    """A queue or stream name no other test uses."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# -- RabbitMQ -------------------------------------------------------------------------------------


def rabbit_publish(
    queue: str, messages: list[tuple[str | None, bytes]], *, dead_letter_queue: str | None = None
) -> None:
    """Publish (message_id, body) pairs to `queue`, persistent; the queue declared durable
    as durable.triggers.RabbitMQ declares it (with its dead-letter queue, if given)."""

    async def go() -> None:
        import aio_pika

        async with await aio_pika.connect(RABBITMQ_URL) as conn:
            channel = await conn.channel()
            arguments = None
            if dead_letter_queue is not None:
                await channel.declare_queue(dead_letter_queue, durable=True)
                arguments = {
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": dead_letter_queue,
                }
            await channel.declare_queue(queue, durable=True, arguments=arguments)
            for message_id, body in messages:
                await channel.default_exchange.publish(
                    aio_pika.Message(body, message_id=message_id, delivery_mode=2),
                    routing_key=queue,
                )

    asyncio.run(go())


def rabbit_count(queue: str) -> int:
    """Messages in `queue` not acknowledged (ready, or delivered to no live consumer)."""

    async def go() -> int:
        import aio_pika

        async with await aio_pika.connect(RABBITMQ_URL) as conn:
            channel = await conn.channel()
            declared = await channel.declare_queue(queue, passive=True)
            return int(declared.declaration_result.message_count or 0)

    return asyncio.run(go())


def rabbit_delete(*queues: str) -> None:
    async def go() -> None:
        import aio_pika

        async with await aio_pika.connect(RABBITMQ_URL) as conn:
            channel = await conn.channel()
            for queue in queues:
                await channel.queue_delete(queue)

    asyncio.run(go())


# -- NATS JetStream --------------------------------------------------------------------------------


def nats_publish(stream: str, subject: str, messages: list[tuple[str | None, bytes]]) -> None:
    """Publish (Nats-Msg-Id, body) pairs on `subject`, the stream created if missing."""

    async def go() -> None:
        import nats
        from nats.js.errors import NotFoundError

        nc = await nats.connect(NATS_URL)
        try:
            js = nc.jetstream()
            try:
                await js.stream_info(stream)
            except NotFoundError:
                await js.add_stream(name=stream, subjects=[subject])
            for msg_id, body in messages:
                headers = {"Nats-Msg-Id": msg_id} if msg_id else None
                await js.publish(subject, body, headers=headers)
        finally:
            await nc.close()

    asyncio.run(go())


def nats_pending(stream: str, consumer: str) -> int:
    """Messages of the consumer not acknowledged (pending delivery or awaiting an ack)."""

    async def go() -> int:
        import nats

        nc = await nats.connect(NATS_URL)
        try:
            info = await nc.jetstream().consumer_info(stream, consumer)
            return int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        finally:
            await nc.close()

    return asyncio.run(go())


def nats_stream_count(stream: str) -> int:
    """Messages the stream holds."""

    async def go() -> int:
        import nats

        nc = await nats.connect(NATS_URL)
        try:
            info = await nc.jetstream().stream_info(stream)
            return int(info.state.messages)
        finally:
            await nc.close()

    return asyncio.run(go())


def nats_delete(stream: str) -> None:
    async def go() -> None:
        import nats

        nc = await nats.connect(NATS_URL)
        try:
            await nc.jetstream().delete_stream(stream)
        except Exception:
            pass
        finally:
            await nc.close()

    asyncio.run(go())


def body(msg: str, **more: Any) -> bytes:
    return json.dumps({"msg": msg, **more}).encode()
