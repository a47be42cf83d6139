"""Messages to and from running workflows: sending a message, following a stream (the
calls, with their awaited forms, and reading a published event are in _client_calls)."""

from __future__ import annotations

import uuid
from typing import Any

from durable import _audit as audit
from durable._models import WorkflowStatus
from durable._names import check_name
from durable._reading import Reading
from durable.errors import ConfigurationError
from durable.serialization import dumps_checked


class Messages(Reading):
    """What a Client sends to and reads from running workflows (see Client)."""

    def _send(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """send (see _client_calls_async.py), on the caller's thread."""
        params = self._message(workflow_id, message, topic, idempotency_key)
        self.get_workflow(workflow_id)  # WorkflowNotFoundError before anything is stored
        audit.send(self, params)  # recorded when an operator sends (the CLI, the console)
        self.notify_work(workflow_id)

    def _message(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """send_message's parameters, the arguments checked and the message encoded."""
        check_name("workflow_id", workflow_id)
        check_name("topic", topic, optional=True)
        check_name("idempotency_key", idempotency_key, optional=True)
        payload = dumps_checked(self.serializer, message, "the message", self.max_payload_bytes)
        return {
            "workflow_id": workflow_id,
            "message_id": idempotency_key or str(uuid.uuid4()),
            "topic": topic or "",
            "payload": payload,
            "sender_id": None,  # from outside any workflow
            "sender_seq": None,
        }

    # -- streams -----------------------------------------------------------------------

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
