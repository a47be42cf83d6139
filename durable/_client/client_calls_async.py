"""The calls of a Client that have an awaited form: retrieve, send, get_event, read_stream,
enqueue, debounce.
The awaited ones are written here; their plain twins (`_client/client_calls.py`) are generated
from this module by tools/async_to_sync.py. A Client has both.

The awaited forms hold no thread while they wait: what they ask of the database runs in a
thread of the event loop's executor, one short call at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from durable._base.names import check_name
from durable._client import debounce_async as debouncing
from durable._client import starts_async as starts
from durable._client.debounce_base import DebounceSpec, P, R
from durable._client.in_txn_async import AppTransaction, new_outbox_id
from durable._client.messages import Messages
from durable._client.queues import Queue
from durable._core import lifecycle
from durable._io.listen import Subscription
from durable._run.acompat import to_thread_async
from durable._run.handles import AsyncWorkflowHandle
from durable._run.host_async import AsyncLifeHost, drive_async
from durable._run.start_options import enqueue_method_async
from durable.errors import ConfigurationError, WorkflowNotFoundError


class AsyncClientCalls(Messages):
    """A Client's calls that have an awaited form (the awaited forms)."""

    async def retrieve_async(self, workflow_id: str) -> AsyncWorkflowHandle:
        """A handle to an existing workflow; raises WorkflowNotFoundError if there is none
        (`await client.retrieve_async(...)`: an AsyncWorkflowHandle)."""
        await to_thread_async(self.get_workflow, workflow_id)
        return AsyncWorkflowHandle(self, workflow_id)

    async def send_async(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
        *,
        before_start: bool = False,
        conn: Any = None,
    ) -> None:
        """Send a message to a workflow (from anywhere); it wakes if it waits in recv().
        Sending twice with the same idempotency_key delivers once.

        An id no workflow has raises WorkflowNotFoundError, unless `before_start=True`:
        the message is then kept for the workflow that starts under that id, whose recv()
        gets it (exactly once, before the messages sent after it, on its topic). Kept
        messages that no workflow took are deleted by retention after
        RetentionPolicy.early_messages_after (7 days by default; never, with no retention
        configured and no `client.prune()`). The error stays the default because an id is
        most often wrong by a typo, and a message kept for a workflow that never comes is
        lost silently; a caller that knows the workflow may not have started yet says so
        (or uses start_or_send, which starts it).

        `conn=`: in the application's transaction on that connection or session (see
        Engine.start): the message arrives once it commits, never if it rolls back (not
        with `before_start=True`: ConfigurationError)."""
        if conn is None:
            await to_thread_async(
                self._send, workflow_id, message, topic, idempotency_key, before_start
            )
            return
        if before_start:
            raise ConfigurationError(
                "send(conn=..., before_start=True): a message kept before its workflow is "
                "written in durable's own transaction; send it without conn=, or start the "
                "workflow with conn= in the same transaction and send after it"
            )
        params = self._message_params(workflow_id, message, topic, idempotency_key)
        app = await AppTransaction.open_async(self, conn)
        if app.same:
            found = await app.fetch_async("get_workflow_status", {"workflow_id": workflow_id})
            if found is None:  # (in this transaction: one it started itself counts)
                raise WorkflowNotFoundError(workflow_id)
        key = new_outbox_id("message", workflow_id, params["message_id"])
        await app.write_async(self, "send_message", params, key, "count")

    async def start_or_send_async(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
        **kwargs: Any,
    ) -> AsyncWorkflowHandle:
        """Deliver `message` to workflow `workflow_id`, first recording `fn(*args,
        **kwargs)` under that id for any worker if no workflow has it (signal-with-start):
        the workflow and its message are written in one transaction, so no run of it
        exists without the message, and two callers at once make one workflow that gets
        both messages. An existing workflow just gets the message (WorkflowConflictError,
        and nothing sent, if it runs another function; one that has finished keeps it
        unread, as ids are idempotency keys and a finished workflow is not started
        again). `topic` and `idempotency_key` are send's; `timeout=` (popped from
        kwargs) replaces the decorator's timeout. Not from workflow code (start a child
        and durable.send to it there). To run it in this process instead, call the
        engine's start_or_send."""
        await to_thread_async(
            self._start_or_send, fn, args, kwargs, workflow_id, message, topic, idempotency_key
        )
        return AsyncWorkflowHandle(self, workflow_id)

    async def get_event_async(self, workflow_id: str, key: str, timeout: float = 0.0) -> Any:
        """The latest value a workflow published under `key`, waiting up to `timeout`
        seconds for it to appear; None if it did not. (get_event_async: between looks it
        sleeps on the event loop.)"""
        check_name("workflow_id", workflow_id)
        check_name("key", key)
        life = lifecycle.event(workflow_id, key, timeout)
        return await drive_async(life, AsyncLifeHost(self))

    async def read_stream_async(
        self, workflow_id: str, key: str, offset: int = 0, *, poll_interval: float = 1.0
    ) -> AsyncIterator[Any]:
        """The values of a workflow's stream `key` from `offset` on, in order, each once,
        following it live until it is closed (or the workflow finished and nothing more is
        there). Waits for new values on the client's one LISTEN connection (shared by all
        its readers), looking again every `poll_interval` seconds in case a notification
        was lost or no LISTEN connection could be had. Reconnecting from the offset after
        the last value seen continues where a reader left off. (read_stream_async: an
        async iterator, which holds no thread while it waits.)"""
        start = self._stream_args(workflow_id, key, offset)
        subscription: Subscription | None = None
        try:
            while True:
                rows, start, ended = await to_thread_async(
                    self._stream_rows, workflow_id, key, start
                )
                for value in rows:  # (`yield from rows` on the sync side)
                    yield value
                if ended:
                    return
                if rows:
                    continue
                if subscription is None:  # listen, then look once more: nothing falls between
                    subscription = await self._listener.subscribe_async(
                        self._stream_channel, workflow_id
                    )
                    continue
                await subscription.wait_async(poll_interval)
        finally:
            if subscription is not None:
                subscription.close()

    @enqueue_method_async
    async def enqueue_async(
        self,
        queue: Queue,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> AsyncWorkflowHandle:
        """Put `fn(*args, **kwargs)` on `queue`; a worker starts it when the queue's limits
        allow. Its options: `workflow_id=` (an existing id returns its handle),
        `dedup_key=` (QueueDedupError while another entry with it is queued or unfinished),
        `priority=` (lower first; queues declared with priority=True), `delay=` (seconds
        before it may start), `partition_key=` (a user or tenant: see Queue) and `timeout=`
        (popped from kwargs: replaces the decorator's timeout). Inside a workflow the entry
        is journaled as a child, so a replay does not enqueue it again; so is a QueueDedupError
        there: a replay raises it again, even once the key is free. `conn=`: in the
        application's transaction (see Engine.start; not with dedup_key=). (enqueue_async,
        awaited: an AsyncWorkflowHandle, journaled from the code of an async workflow.)"""
        chosen = await starts.enqueue_async(
            self,
            queue,
            fn,
            args,
            kwargs,
            workflow_id=workflow_id,
            dedup_key=dedup_key,
            priority=priority,
            delay=delay,
            partition_key=partition_key,
            conn=conn,
        )
        return AsyncWorkflowHandle(self, chosen)

    async def debounce_async(
        self, debouncer: DebounceSpec[P, R], key: str, /, *args: P.args, **kwargs: P.kwargs
    ) -> AsyncWorkflowHandle:
        """Debounce a start of the debouncer's workflow under `key` (see durable.Debouncer):
        it runs once the key has been quiet for the debouncer's period, with the arguments
        of the last debounce before it started. Returns the handle of that run."""
        workflow_id = await debouncing.debounce_async(self, debouncer, key, args, kwargs)
        return AsyncWorkflowHandle(self, workflow_id)
