"""What code outside a run asks of the engine of `with durable.Engine():` to run a
workflow called as a function and to connect to the application database, declared once.

The awaited forms are declared here; the plain ones (`_run/active.py`) are generated from this
module by tools/async_to_sync.py, as the Engine's calls they declare are
(`_host/engine_calls.py` from `_host/engine_calls_async.py`). `_context.ActiveEngine` joins both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import sqlalchemy.ext.asyncio

    from durable._base.registry import WorkflowDef


class AsyncRunsHere(Protocol):
    """An active engine's direct run and application connection, in one of their two
    forms (see the module docstring)."""

    async def _run_direct_async(
        self, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any: ...

    def app_connection_async(
        self, isolation_level: str | None = None
    ) -> AbstractAsyncContextManager[sqlalchemy.ext.asyncio.AsyncConnection]: ...
