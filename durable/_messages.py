"""Messages to and from running workflows: sending a message, reading a published event,
following a stream. Each has an awaited form that holds no thread while it waits."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from durable import _audit as audit
from durable import _lifecycle as lifecycle
from durable._host_async import AsyncLifeHost, drive_async
from durable._host_sync import LifeHost, drive
from durable._listen import Subscription
from durable._models import WorkflowStatus
from durable._names import check_name
from durable._reading import Reading
from durable.errors import ConfigurationError
from durable.serialization import dumps_checked


class Messages(Reading):
    """What a Client sends to and reads from running workflows (see Client)."""

    def send(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """Send a message to a workflow (from anywhere); it wakes if it waits in recv().
        Sending twice with the same idempotency_key delivers once."""
        check_name("topic", topic, optional=True)
        check_name("idempotency_key", idempotency_key, optional=True)
        self.get_workflow(workflow_id)  # WorkflowNotFoundError before anything is stored
        payload = dumps_checked(self.serializer, message, "the message", self.max_payload_bytes)
        params = {
            "workflow_id": workflow_id,
            "message_id": idempotency_key or str(uuid.uuid4()),
            "topic": topic or "",
            "payload": payload,
            "sender_id": None,  # from outside any workflow
            "sender_seq": None,
        }
        audit.send(self, params)  # recorded when an operator sends (the CLI, the console)
        self.notify_work(workflow_id)

    async def send_async(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """send, awaited."""
        await asyncio.to_thread(self.send, workflow_id, message, topic, idempotency_key)

    def get_event(self, workflow_id: str, key: str, timeout: float = 0.0) -> Any:
        """The latest value a workflow published under `key`, waiting up to `timeout`
        seconds for it to appear; None if it did not."""
        check_name("workflow_id", workflow_id)
        check_name("key", key)
        return drive(lifecycle.event(workflow_id, key, timeout), LifeHost(self))

    async def get_event_async(self, workflow_id: str, key: str, timeout: float = 0.0) -> Any:
        """get_event, awaited: between looks it sleeps on the event loop."""
        check_name("workflow_id", workflow_id)
        check_name("key", key)
        life = lifecycle.event(workflow_id, key, timeout)
        return await drive_async(life, AsyncLifeHost(self))

    # -- streams -----------------------------------------------------------------------

    def read_stream(
        self, workflow_id: str, key: str, offset: int = 0, *, poll_interval: float = 1.0
    ) -> Iterator[Any]:
        """The values of a workflow's stream `key` from `offset` on, in order, each once,
        following it live until it is closed (or the workflow finished and nothing more is
        there). Waits for new values on the client's one LISTEN connection (shared by all
        its readers), looking again every `poll_interval` seconds in case a notification
        was lost or no LISTEN connection could be had. Reconnecting from the offset after
        the last value seen continues where a reader left off."""
        start = self._stream_args(workflow_id, key, offset)
        subscription: Subscription | None = None
        try:
            while True:
                rows, start, ended = self._stream_rows(workflow_id, key, start)
                yield from rows
                if ended:
                    return
                if rows:
                    continue
                if subscription is None:  # listen, then look once more: nothing falls between
                    subscription = self._listener.subscribe(self._stream_channel, workflow_id)
                    continue
                subscription.wait(poll_interval)
        finally:
            if subscription is not None:
                subscription.close()

    async def read_stream_async(
        self, workflow_id: str, key: str, offset: int = 0, *, poll_interval: float = 1.0
    ) -> AsyncIterator[Any]:
        """read_stream, as an async iterator (no thread is held while it waits)."""
        start = self._stream_args(workflow_id, key, offset)
        subscription: Subscription | None = None
        try:
            while True:
                rows, start, ended = await asyncio.to_thread(
                    self._stream_rows, workflow_id, key, start
                )
                for value in rows:
                    yield value
                if ended:
                    return
                if rows:
                    continue
                if subscription is None:
                    subscription = await self._listener.subscribe_async(
                        self._stream_channel, workflow_id
                    )
                    continue
                await subscription.wait_async(poll_interval)
        finally:
            if subscription is not None:
                subscription.close()

    def _stream_args(self, workflow_id: str, key: str, offset: int) -> int:
        check_name("workflow_id", workflow_id)
        check_name("key", key)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigurationError(f"offset={offset!r}: give a whole number >= 0")
        self.get_workflow(workflow_id)  # WorkflowNotFoundError for a wrong id
        return offset

    def _stream_rows(self, workflow_id: str, key: str, start: int) -> tuple[list[Any], int, bool]:
        """One look: (values from `start` on, the next offset, whether the stream ended).
        The status is read before the rows: a workflow seen finished has written all."""
        finished = WorkflowStatus(
            (self.db.fetch_one("get_workflow_status", {"workflow_id": workflow_id}) or {}).get(
                "status", "SUCCESS"
            )
        ).is_terminal
        rows = self.db.fetch_all(
            "read_stream",
            {"workflow_id": workflow_id, "key": key, "offset": start, "limit": 1000},
        )
        values: list[Any] = []
        for row in rows:
            if row["closed"]:
                return values, start, True
            values.append(self.serializer.loads(row["value"]))
            start = int(row["offset"]) + 1
        return values, start, finished and not rows
