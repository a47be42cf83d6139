"""Context variables: which engine is active and which workflow run is executing.

ContextVars (not thread-locals or globals) keep concurrent runs in one process apart, and
carry over to asyncio tasks. The engine is seen through the small protocol below, so this
module (and everything the decorators reach) does not import the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from durable._protocol import Run, StepScope

if TYPE_CHECKING:
    import sqlalchemy
    import sqlalchemy.ext.asyncio

    from durable._registry import WorkflowDef


class ActiveEngine(Protocol):
    """What code outside a run needs from the engine of `with durable.Engine():`."""

    def _run_direct(
        self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any: ...

    def app_connection(
        self, isolation_level: str | None = None
    ) -> AbstractContextManager[sqlalchemy.Connection]: ...

    def enqueue(self, queue: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any: ...

    async def _run_direct_async(
        self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any: ...

    def app_connection_async(
        self, isolation_level: str | None = None
    ) -> AbstractAsyncContextManager[sqlalchemy.ext.asyncio.AsyncConnection]: ...


current_engine: ContextVar[ActiveEngine | None] = ContextVar("durable_engine", default=None)
current_run: ContextVar[Run | None] = ContextVar("durable_run", default=None)
current_step: ContextVar[StepScope | None] = ContextVar("durable_step", default=None)


def workflow_code_run() -> Run | None:
    """The run whose workflow function (not one of its steps) is calling, if any: where a
    decorated call is journaled. Inside a step's code, decorated calls are plain calls."""
    run = current_run.get()
    if run is None or current_step.get() is not None:
        return None
    return run
