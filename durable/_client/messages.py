"""Messages to and from running workflows: sending a message, following a stream (the
calls, with their awaited forms, and reading a published event are in _client_calls)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable._base.models import WorkflowStatus
from durable._base.names import check_name
from durable._client import audit
from durable._client.reading import Reading
from durable._run.context import refuse_in_workflow
from durable._run.decorators import workflow_call
from durable._run.host_sync import create_and_send
from durable._run.timeouts import call_timeout, pop_timeout
from durable.errors import ConfigurationError
from durable.serialization import dumps_checked

if TYPE_CHECKING:
    from durable._io.systemdb import Tx


class Messages(Reading):
    """What a Client sends to and reads from running workflows (see Client)."""

    def _send(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
        before_start: bool = False,
    ) -> None:
        """send (see _client/client_calls_async.py), on the caller's thread."""
        if not before_start:
            check_name("topic", topic, optional=True)
            check_name("idempotency_key", idempotency_key, optional=True)
            self.get_workflow(workflow_id)  # WorkflowNotFoundError before anything is stored
        params = self._message_params(workflow_id, message, topic, idempotency_key)
        if before_start:
            kept = audit.keep_early(self, params)
            if kept is not None and not kept["found"]:
                self._crash_point("after_keep_early_message")
                # Kept for a run not there yet. A workflow whose creation committed after
                # this statement's snapshot and whose run already looked for kept
                # messages must get it too: look again, now that this is committed.
                self._adopt_early(workflow_id)
                return
        audit.send(self, params)  # recorded when an operator sends (the CLI, the console)
        self.notify_work(workflow_id)

    def _message_params(
        self, workflow_id: str, message: Any, topic: str | None, idempotency_key: str | None
    ) -> dict[str, Any]:
        """send_message's parameters for a message from outside any workflow."""
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

    def _start_or_send(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        workflow_id: str,
        message: Any,
        topic: str | None,
        idempotency_key: str | None,
    ) -> None:
        """start_or_send (see _client/client_calls_async.py), on the caller's thread: the workflow
        recorded PENDING for any worker, and the message, in one transaction."""
        refuse_in_workflow("start_or_send")
        check_name("workflow_id", workflow_id)
        defn, call_args = workflow_call(fn, args)
        with call_timeout(pop_timeout(kwargs)):
            inputs = self.inputs.encode(defn, call_args, kwargs)
            row = self.inputs.row(defn, workflow_id, inputs, None, self.default_durability)
        params = self._message_params(workflow_id, message, topic, idempotency_key)

        def work(tx: Tx) -> dict[str, Any] | None:
            return create_and_send(tx, True, row, defn.name, params)

        self.db.atomically(work, "start_or_send")
        self._crash_point("after_start_or_send")
        self.notify_work(workflow_id)  # new, or woken by the message

    def _crash_point(self, name: str) -> None:
        """SIGKILL this process the n-th time `name` is reached, if DURABLE_CRASH_POINTS
        arms it (crash tests of a sender: as Runner.crash_point for a run)."""
        armed = self.config.crash_points.get(name)
        if armed is None:
            return
        counts: dict[str, int] = self.__dict__.setdefault("_crash_counts", {})
        counts[name] = counts.get(name, 0) + 1
        if counts[name] == armed:
            os.kill(os.getpid(), signal.SIGKILL)

    def _adopt_early(self, workflow_id: str) -> None:
        """Move the messages kept for `workflow_id` to its workflow if it exists now, and
        wake it if it waits (and the workers, if that made it runnable)."""
        row = self.db.fetch_one("adopt_early_messages", {"workflow_id": workflow_id, "wake": True})
        if row is not None and row["woken"]:
            self.notify_work(workflow_id)

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
