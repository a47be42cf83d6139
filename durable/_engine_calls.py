# Generated from durable/_engine_calls_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
"""The Engine's calls that run workflows in this process, with their awaited forms: a
start, a workflow called as a function, a connection to the application database.

The awaited ones are written here; their plain twins (`_engine_calls.py`) are generated
from this module by tools/async_to_sync.py. An Engine has both. They differ in what they
run on, and the source says so in `if True:  # ASYNC ... else:` blocks: the plain forms
run on the engine's threads (its Runner), the awaited ones on the caller's event loop,
through its AsyncHost (found, or opened, by the call).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from durable import _lifecycle as lifecycle
from durable._acompat import Future
from durable._decorators import workflow_call
from durable._handles import WorkflowHandle
from durable._host_sync import LifeHost, drive
from durable._names import check_name
from durable._start_options import start_method
from durable._starts import start_in, start_placed
from durable._timeouts import pop_timeout, workflow_timeout

if TYPE_CHECKING:
    import sqlalchemy

    from durable._async_host import AsyncHosts
    from durable._client import Client
    from durable._registry import WorkflowDef
    from durable._runner import Runner


class EngineCalls:
    """An Engine's calls that run workflows in this process, in one of their two forms
    (see the module docstring)."""

    client: Client
    runner: Runner

    if TYPE_CHECKING:  # the Engine's

        def _ensure_running(self) -> None: ...

        def _hosts(self) -> AsyncHosts: ...

    @start_method
    def start(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        conn: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle:
        """Start `fn(*args, **kwargs)` as a workflow on this engine.

        Pass `workflow_id=` to choose the id: ids are idempotency keys,
        so starting an existing id returns a handle to that workflow (resuming it here if it
        is interrupted and nobody holds its lease). `timeout=` (popped from kwargs: seconds or a
        timedelta) replaces the decorator's timeout for this workflow (see
        durable.workflow_timeout). Inside a workflow the start is journaled
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
            chosen = start_in(self.client, conn, fn, args, kwargs, workflow_id, remember)
            return WorkflowHandle(self.client, chosen)
        if (timeout := pop_timeout(kwargs)) is not None:
            with workflow_timeout(timeout):
                start = cast(Any, self.start)
                return start(fn, *args, workflow_id=workflow_id, **kwargs)  # type: ignore[no-any-return]
        defn, call_args = workflow_call(fn, args)
        self._ensure_running()
        host = LifeHost(self.client, self.runner)

        def create(chosen: str, parent: tuple[str, int] | None) -> WorkflowHandle:
            inputs = self.client.inputs.encode(defn, call_args, kwargs)
            life = lifecycle.start(defn, chosen, inputs, parent)
            waiter: Future[Any] | None = drive(life, host)
            return WorkflowHandle(self.client, chosen, waiter)  # (reads the run's error)

        chosen, started = start_placed(defn, workflow_id, create)
        return started if started is not None else WorkflowHandle(self.client, chosen)

    def _run_direct(self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """A workflow called as a function inside `with engine:` (an async one awaited
        inside `async with engine:`): run it here, in this thread (in this task)."""
        self._ensure_running()
        host = self.runner
        inputs = self.client.inputs.encode(defn, args, kwargs)
        return host.run_inline(lifecycle.Create(defn, str(uuid.uuid4()), inputs, None))

    @contextmanager
    def app_connection(self, isolation_level: str | None = None) -> Iterator[sqlalchemy.Connection]:
        """A SQLAlchemy connection to the application database (that of @transaction
        steps). (app_connection_async: an AsyncConnection, on this event loop.)"""
        host = self.runner
        with host.app_connection(isolation_level) as conn:
            yield conn
