"""A table of the system database as a trigger's source: the transactional outbox.

An application writes a message in the transaction that changes its data
(`PostgresOutbox.write(conn, ...)`: a row of `durable.trigger_outbox`, and a NOTIFY sent when
that transaction commits), so the message exists exactly when the change does. A worker
takes waiting rows of its topic (each hidden for `lease` seconds while it is handled),
commits the workflow's row, then deletes the message (its acknowledgement). A worker that
dies leaves the row, taken again after the lease; the workflow id it names is found, not
recorded twice. A message that can never start a workflow stays in the table with why
(`rejected`), out of the consumers' way. No extra is needed: it is PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg

from durable._base.names import check_name
from durable._io.systemdb import SystemDB, write_outbox
from durable.errors import DefinitionError, EngineNotRunningError
from durable.triggers._source import Delivery, Message, Source


def channel(schema: str) -> str:
    """The channel a schema's outbox writes NOTIFY."""
    return f"{schema}_outbox"


class _OutboxDelivery(Delivery):
    def __init__(self, source: PostgresOutbox, row: dict[str, Any]) -> None:
        self._source = source
        self.message = Message(
            body=str(row["body"]).encode("utf-8"),
            id=str(row["message_id"]),
            headers={str(k): str(v) for k, v in json.loads(row["headers"]).items()},
            subject=source.topic,
            redelivered=int(row["deliveries"]) > 1,
        )

    async def ack(self) -> None:
        await self._source._run("outbox_ack", self.message.id)

    async def retry(self, delay: float) -> None:
        await self._source._run("outbox_retry", self.message.id, delay_seconds=delay)

    async def reject(self, reason: str) -> None:
        await self._source._run("outbox_reject", self.message.id, reason=reason)


class PostgresOutbox(Source):
    """Consume the messages of `topic` in the system database's outbox table.

    lease: seconds a taken message stays hidden from other consumers while it is handled;
      after a crash, how long before another takes it (default 30).
    batch: messages taken at once (default 16).
    poll_interval: seconds between looks when no notification arrives (default 1).
    The message id (the default key) is the id it was written with.
    """

    def __init__(
        self, topic: str, *, lease: float = 30.0, batch: int = 16, poll_interval: float = 1.0
    ) -> None:
        check_name("topic", topic)
        if not lease > 0 or batch < 1 or not poll_interval > 0:
            raise DefinitionError(
                f"PostgresOutbox(lease={lease}, batch={batch}, poll_interval={poll_interval})"
                ": give a lease and a poll interval above 0 seconds and a batch of 1 or more"
            )
        self.topic = topic
        self.lease = lease
        self.batch = batch
        self.poll_interval = poll_interval
        self._db: SystemDB | None = None
        self._listen: psycopg.Connection[Any] | None = None

    def write(
        self,
        conn: Any,
        message_id: str,
        body: Any,
        *,
        headers: Mapping[str, str] | None = None,
        schema: str = "durable",
    ) -> None:
        """Write a message on the application's connection (a SQLAlchemy Connection or a
        psycopg Connection), in its transaction: it is consumed once that commits. `body`
        is a JSON value; a message id written twice for a topic is refused by the key."""
        check_name("message_id", message_id)
        params = {
            "topic": self.topic,
            "message_id": message_id,
            "body": json.dumps(body),
            "headers": json.dumps(dict(headers or {})),
        }
        write_outbox(conn, schema, params, channel(schema))

    @property
    def describe(self) -> str:
        return f"PostgreSQL outbox topic {self.topic!r}"

    def attach(self, db: SystemDB) -> None:
        self._db = db  # the engine's: its pool, its schema

    async def open(self) -> None:
        db = self._db
        if db is None:
            raise EngineNotRunningError(
                "a PostgresOutbox is consumed by an engine's worker: its database is the "
                "engine's (durable worker, Engine(worker=True) or run_worker)"
            )
        self._listen = await asyncio.to_thread(db.listen_connection, channel(db.schema))

    async def deliveries(self) -> AsyncIterator[Delivery]:
        db = self._db
        assert db is not None, "open() first"
        params = {"topic": self.topic, "lease_seconds": self.lease, "limit": self.batch}
        while True:
            rows = await asyncio.to_thread(db.fetch_all, "outbox_take", params)
            for row in rows:
                yield _OutboxDelivery(self, row)
            if len(rows) < self.batch:
                await asyncio.to_thread(self._wait)

    def _wait(self) -> None:
        """Until a notification of this topic, or the poll interval."""
        conn = self._listen
        if conn is None:
            time.sleep(self.poll_interval)
            return
        for note in conn.notifies(timeout=self.poll_interval):
            if note.payload == self.topic:
                return

    async def _run(self, name: str, message_id: str | None, **more: Any) -> None:
        db = self._db
        assert db is not None
        params = {"topic": self.topic, "message_id": message_id, **more}
        await asyncio.to_thread(db.execute, name, params)

    async def close(self) -> None:
        conn, self._listen = self._listen, None
        if conn is not None:
            await asyncio.to_thread(conn.close)
