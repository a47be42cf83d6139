"""The Engine's calls that run workflows in this process, with their awaited forms: a
start, a workflow called as a function, a connection to the application database.

The awaited ones are written here; their plain twins (`_host/engine_calls.py`) are generated
from this module by tools/async_to_sync.py. An Engine has both. They differ in what they
run on, and the source says so in `if True:  # ASYNC ... else:` blocks: the plain forms
run on the engine's threads (its Runner), the awaited ones on the caller's event loop,
through its AsyncHost (found, or opened, by the call).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from durable._base.names import check_name
from durable._client.starts_async import start_in_async, start_placed_async
from durable._core import lifecycle
from durable._run.acompat import AsyncFuture
from durable._run.attributes import call_attributes, pop_attributes
from durable._run.context import refuse_in_workflow
from durable._run.decorators import workflow_call
from durable._run.handles import AsyncWorkflowHandle
from durable._run.host_async import AsyncLifeHost, drive_async
from durable._run.start_options import start_method_async
from durable._run.timeouts import call_timeout, pop_timeout

if TYPE_CHECKING:
    import sqlalchemy.ext.asyncio

    from durable._base.registry import WorkflowDef
    from durable._client.client import Client
    from durable._host.async_host import AsyncHosts
    from durable._host.runner import Runner


class AsyncEngineCalls:
    """An Engine's calls that run workflows in this process, in one of their two forms
    (see the module docstring)."""

    client: Client
    runner: Runner

    if TYPE_CHECKING:  # the Engine's

        def _ensure_running(self) -> None: ...

        def _hosts(self) -> AsyncHosts: ...

    @start_method_async
    async def start_async(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> AsyncWorkflowHandle:
        """Start `fn(*args, **kwargs)` as a workflow on this engine.

        Pass `workflow_id=` to choose the id: ids are idempotency keys,
        so starting an existing id returns a handle to that workflow (resuming it here if it
        is interrupted and nobody holds its lease). `timeout=` (popped from kwargs: seconds or a
        timedelta) replaces the decorator's timeout for this workflow (see
        durable.workflow_timeout); `attributes=` (popped too) records the run's attributes
        (see durable.set_attributes). Inside a workflow the start is journaled
        as a child, so a replay does not start it again.

        start runs the workflow in this engine's threads. start_async starts it from async
        code: an async def workflow runs as a task on the calling event loop (its steps may
        use what the application made on it); a sync one on this engine's threads. It
        returns once the workflow is recorded; `await handle.result()` waits without
        blocking the loop. Inside an async workflow the start is journaled as a child.

        `conn=`: the application's connection or session, its transaction open (psycopg's
        Connection, SQLAlchemy's Connection or Session; for start_async their async forms).
        The workflow is written in that transaction, so it exists once the application
        commits and never if it rolls back; nothing runs before the commit. After it, a
        worker or this engine claims and runs it (the handle's result() waits for it). On
        another database than durable's, it goes to that database's outbox (`outbox_url=`),
        else OutboxRequiredError.
        """
        check_name("workflow_id", workflow_id, optional=True)
        if conn is not None:
            self._ensure_running()
            # Not a worker: its keeper claims the workflow once it is committed.
            remember = None if self.client.config.worker else self.runner.remember
            chosen = await start_in_async(
                self.client, conn, fn, args, kwargs, workflow_id, remember
            )
            return AsyncWorkflowHandle(self.client, chosen)
        timeout, attributes = pop_timeout(kwargs), pop_attributes(kwargs)
        if timeout is not None or attributes is not None:
            with call_timeout(timeout), call_attributes(attributes):
                start = cast(Any, self.start_async)
                return await start(fn, *args, workflow_id=workflow_id, **kwargs)  # type: ignore[no-any-return]
        defn, call_args = workflow_call(fn, args)
        self._ensure_running()
        host = await self._start_host_async()

        async def create(chosen: str, parent: tuple[str, int] | None) -> AsyncWorkflowHandle:
            inputs = self.client.inputs.encode(defn, call_args, kwargs)
            life = lifecycle.start(defn, chosen, inputs, parent)
            waiter: AsyncFuture[Any] | None = await drive_async(life, host)
            return AsyncWorkflowHandle(self.client, chosen, waiter)  # (reads the run's error)

        chosen, started = await start_placed_async(defn, workflow_id, create)
        return started if started is not None else AsyncWorkflowHandle(self.client, chosen)

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
        """Deliver `message` to workflow `workflow_id`, first starting `fn(*args,
        **kwargs)` under that id on this engine if no workflow has it (signal-with-start).
        The workflow and its message are written in one transaction: no run of it exists
        without the message, a crash after the commit loses neither, and two callers at
        once make one workflow that gets both messages (its recv() takes them on `topic`,
        in the order they committed). An existing workflow gets the message, and is
        resumed here as start does if it is interrupted and nobody holds it
        (WorkflowConflictError, and nothing sent, if it runs another function; one that
        has finished keeps it unread: ids are idempotency keys, a finished workflow is not
        started again). `topic` and `idempotency_key` are send's (with a key, calling
        again delivers once); `timeout=` (popped from kwargs) is start's. Not from
        workflow code: there, start a child (durable.start_child) and durable.send to it.

        start_or_send runs the workflow in this engine's threads; start_or_send_async as
        start_async does (an async def workflow on the calling event loop)."""
        refuse_in_workflow("start_or_send")
        check_name("workflow_id", workflow_id)
        with call_timeout(pop_timeout(kwargs)):
            defn, call_args = workflow_call(fn, args)
            self._ensure_running()
            params = self.client._message_params(workflow_id, message, topic, idempotency_key)
            inputs = self.client.inputs.encode(defn, call_args, kwargs)
            host = await self._start_host_async()
            life = lifecycle.start(defn, workflow_id, inputs, None, params)
            waiter: AsyncFuture[Any] | None = await drive_async(life, host)
        self.client.notify_work(workflow_id)  # an existing one the message made runnable
        return AsyncWorkflowHandle(self.client, workflow_id, waiter)

    async def _start_host_async(self) -> AsyncLifeHost:
        """The host of a start: on the calling event loop, where an async workflow that
        waits resumes (start_async), or on the engine's threads (start)."""
        if True:  # ASYNC
            hosts = self._hosts()
            loop = await hosts.here()
            return AsyncLifeHost(
                self.client,
                self.runner,
                loop=loop,
                home=lambda workflow_id: hosts.home(
                    workflow_id, loop
                ),  # if it waits, it resumes here
            )
        else:
            return AsyncLifeHost(self.client, self.runner)

    async def _run_direct_async(
        self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """A workflow called as a function inside `with engine:` (an async one awaited
        inside `async with engine:`): run it here, in this thread (in this task)."""
        self._ensure_running()
        if True:  # ASYNC
            host = await self._hosts().here()
        else:
            host = self.runner
        inputs = self.client.inputs.encode(defn, args, kwargs)
        return await host.run_inline(lifecycle.Create(defn, str(uuid.uuid4()), inputs, None))

    @asynccontextmanager
    async def app_connection_async(
        self, isolation_level: str | None = None
    ) -> AsyncIterator[sqlalchemy.ext.asyncio.AsyncConnection]:
        """A SQLAlchemy connection to the application database (that of @transaction
        steps). (app_connection_async: an AsyncConnection, on this event loop.)"""
        if True:  # ASYNC
            host = await self._hosts().here()
        else:
            host = self.runner
        async with host.app_connection(isolation_level) as conn:
            yield conn
