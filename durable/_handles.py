"""Handles: a reference to one workflow by id, valid in any process, to read its status
and wait for its result (`result()` performs lifecycle.result, sync or awaited).

A handle reads through the client that made it, and only a little of it (the `Reader`
protocol below), so it lives apart from the Client: the modules that return handles
(queues, the engine) need not import the client.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from durable import _lifecycle as lifecycle
from durable._local import LocalRun, ended
from durable._models import WorkflowInfo, WorkflowStatus
from durable.errors import WorkflowNotFoundError

if TYPE_CHECKING:
    import concurrent.futures

    from durable._systemdb import SystemDB


class Reader(Protocol):
    """What a handle reads through: the client (or engine) that made it."""

    @property
    def db(self) -> SystemDB: ...

    def get_workflow(self, workflow_id: str) -> WorkflowInfo: ...

    def finished(self, workflow_id: str) -> tuple[bool, Any]: ...

    def outcome(
        self, workflow_id: str, status: WorkflowStatus, output: str | None, error: str | None
    ) -> Any: ...


class WorkflowHandle:
    """A reference to one workflow by id; valid in any process."""

    def __init__(
        self,
        client: Reader,
        workflow_id: str,
        future: concurrent.futures.Future[Any] | None = None,
    ) -> None:
        self._client = client
        self._workflow_id = workflow_id
        self._future = future

    @property
    def workflow_id(self) -> str:
        return self._workflow_id

    def status(self) -> WorkflowStatus:
        """The stored status right now."""
        row = self._client.db.fetch_one("get_workflow_status", {"workflow_id": self._workflow_id})
        if row is None:
            raise WorkflowNotFoundError(self._workflow_id)
        return WorkflowStatus(row["status"])

    def info(self) -> WorkflowInfo:
        return self._client.get_workflow(self._workflow_id)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the workflow to finish and return its value.

        Raises WorkflowFailedError if it failed, WorkflowCancelledError if it was cancelled
        and ResultTimeoutError if it is still running after `timeout` seconds (it keeps
        running). The value is what the database stores, so it is the same in every process.

        A workflow this engine started and no thread has begun yet is run on the calling
        thread when there is no `timeout` (see _local.LocalRun): a Ctrl-C then lands in
        its code, and the run is given up for recovery.
        """
        import concurrent.futures

        future = self._future

        def perform(op: lifecycle.Op) -> Any:
            match op:
                case lifecycle.WaitLocal() if future is not None:
                    if op.timeout is None and isinstance(future, LocalRun):
                        future.run_on_caller()
                    # Wait for the local run, but never re-raise what it raised (a
                    # SystemExit in a step must not end the caller's process): the
                    # database says how it ended, unless it ended SUCCESS here.
                    done, _ = concurrent.futures.wait([future], timeout=op.timeout)
                    return local_end(self._client, self._workflow_id, future) if done else None
                case lifecycle.Finished():
                    return self._client.finished(op.workflow_id)
                case lifecycle.Now():
                    return time.monotonic()
                case lifecycle.Sleep():
                    time.sleep(op.seconds)
                    return None
            raise AssertionError(f"result does not ask for {op!r}")

        life = lifecycle.result(self._workflow_id, timeout, future is not None)
        return lifecycle.drive(life, perform)

    def __repr__(self) -> str:
        return f"WorkflowHandle({self._workflow_id!r})"


def local_end(client: Reader, workflow_id: str, future: Any) -> tuple[bool, Any]:
    """lifecycle.WaitLocal's answer for a local run that ended (a future of either kind):
    its value if it left the text of a SUCCESS output, else (False, None)."""
    output = ended(future)
    if output is None:
        return False, None
    return True, client.outcome(workflow_id, WorkflowStatus.SUCCESS, output, None)


def _retrieved(waiter: asyncio.Future[Any]) -> None:
    """The local run ended: what it raised is in the database (and was logged), where
    result() reads it, so the future's copy counts as read rather than being reported by
    the event loop as 'never retrieved' (also when the caller never asks)."""
    if not waiter.cancelled():
        waiter.exception()


class AsyncWorkflowHandle:
    """A WorkflowHandle for async code: `await handle.result()`, `await handle.status()`.
    Waiting holds no thread: each look at the database is a short call in a worker
    thread, and between looks the handle sleeps on the event loop."""

    def __init__(
        self, client: Reader, workflow_id: str, waiter: asyncio.Future[Any] | None = None
    ) -> None:
        self._client = client
        self._workflow_id = workflow_id
        self._waiter = waiter
        if waiter is not None:
            waiter.add_done_callback(_retrieved)

    @property
    def workflow_id(self) -> str:
        return self._workflow_id

    async def status(self) -> WorkflowStatus:
        """The stored status right now."""
        return await asyncio.to_thread(WorkflowHandle(self._client, self._workflow_id).status)

    async def info(self) -> WorkflowInfo:
        return await asyncio.to_thread(self._client.get_workflow, self._workflow_id)

    async def result(self, timeout: float | None = None) -> Any:
        """As WorkflowHandle.result, awaited."""
        waiter = self._waiter

        async def perform(op: lifecycle.Op) -> Any:
            match op:
                case lifecycle.WaitLocal() if waiter is not None:
                    # The run here: wait for it without re-raising what it raised (above).
                    done, _ = await asyncio.wait([waiter], timeout=op.timeout)
                    if not done:
                        return None
                    return local_end(self._client, self._workflow_id, waiter)
                case lifecycle.Finished():
                    return await asyncio.to_thread(self._client.finished, op.workflow_id)
                case lifecycle.Now():
                    return time.monotonic()
                case lifecycle.Sleep():
                    await asyncio.sleep(op.seconds)
                    return None
            raise AssertionError(f"result does not ask for {op!r}")

        life = lifecycle.result(self._workflow_id, timeout, waiter is not None)
        return await lifecycle.drive_async(life, perform)

    def __repr__(self) -> str:
        return f"AsyncWorkflowHandle({self._workflow_id!r})"
