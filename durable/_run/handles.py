"""Handles: a reference to one workflow by id, valid in any process, to read its status
and wait for its result (`result()` performs lifecycle.result, sync or awaited).

A handle reads through the client that made it, and only a little of it (the `Reader`
protocol below), so it lives apart from the Client: the modules that return handles
(queues, the engine) need not import the client.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Generic, Protocol

from durable._base.models import WorkflowInfo, WorkflowStatus
from durable._core import lifecycle
from durable._run.host_async import AsyncLifeHost, drive_async
from durable._run.host_sync import LifeHost, drive
from durable._run.host_sync import Reader as HostReader
from durable.errors import WorkflowNotFoundError

if TYPE_CHECKING:
    import concurrent.futures

    from typing_extensions import TypeVar

    from durable._io.systemdb import SystemDB

    #: What the workflow returns; a handle written without it is a handle of Any.
    R = TypeVar("R", covariant=True, default=Any)
else:
    from typing import TypeVar

    R = TypeVar("R", covariant=True)


class Reader(HostReader, Protocol):
    """What a handle reads through: the client (or engine) that made it."""

    @property
    def db(self) -> SystemDB: ...

    def get_workflow(self, workflow_id: str) -> WorkflowInfo: ...


class WorkflowHandle(Generic[R]):
    """A reference to one workflow by id; valid in any process. `WorkflowHandle[R]`: its
    result() is what the workflow returns, an R (a start types it by the function)."""

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

    def result(self, timeout: float | None = None) -> R:
        """Wait for the workflow to finish and return its value.

        Raises WorkflowFailedError if it failed, WorkflowCancelledError if it was cancelled
        and ResultTimeoutError if it is still running after `timeout` seconds (it keeps
        running). The value is what the database stores, so it is the same in every process.

        A workflow this engine started and no thread has begun yet is run on the calling
        thread when there is no `timeout` (see _local.LocalRun): a Ctrl-C then lands in
        its code, and the run is given up for recovery.
        """
        life = lifecycle.result(self._workflow_id, timeout, self._future is not None)
        result: R = drive(life, LifeHost(self._client, waiter=self._future))
        return result

    def __repr__(self) -> str:
        return f"WorkflowHandle({self._workflow_id!r})"


def _retrieved(waiter: asyncio.Future[Any]) -> None:
    """The local run ended: what it raised is in the database (and was logged), where
    result() reads it, so the future's copy counts as read rather than being reported by
    the event loop as 'never retrieved' (also when the caller never asks)."""
    if not waiter.cancelled():
        waiter.exception()


class AsyncWorkflowHandle(Generic[R]):
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

    async def result(self, timeout: float | None = None) -> R:
        """As WorkflowHandle.result, awaited."""
        life = lifecycle.result(self._workflow_id, timeout, self._waiter is not None)
        result: R = await drive_async(life, AsyncLifeHost(self._client, waiter=self._waiter))
        return result

    def __repr__(self) -> str:
        return f"AsyncWorkflowHandle({self._workflow_id!r})"
