"""Context variables: which engine is active and which workflow run is executing.

ContextVars (not thread-locals or globals) keep concurrent runs in one process apart, and
carry over to asyncio tasks. The engine is seen through the small protocol below, so this
module (and everything the decorators reach) does not import the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from durable._protocol import Run

if TYPE_CHECKING:
    import sqlalchemy

    from durable._registry import WorkflowDef


class ActiveEngine(Protocol):
    """What code outside a run needs from the engine of `with durable.Engine():`."""

    def run_direct(
        self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any: ...

    def app_connection(
        self, isolation_level: str | None = None
    ) -> AbstractContextManager[sqlalchemy.Connection]: ...

    def enqueue(self, queue: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any: ...


current_engine: ContextVar[ActiveEngine | None] = ContextVar("durable_engine", default=None)
current_run: ContextVar[Run | None] = ContextVar("durable_run", default=None)
