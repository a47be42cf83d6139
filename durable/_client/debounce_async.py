"""Debouncing a start (see _client/debounce_base.py for how a debounce is recorded): the awaited
debounce of a Debouncer and of a client, written here; the plain ones (`_client/debounce.py`) are
generated from this module by tools/async_to_sync.py. durable.Debouncer has both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from durable._base import labels
from durable._base.registry import StepDef
from durable._client.debounce_base import DebounceSpec, P, R, record
from durable._client.starts_async import Recorder
from durable._run import driver_async as _driver_async
from durable._run.acompat import to_thread_async
from durable._run.context import async_run, current_engine, sync_run
from durable._run.handles import AsyncWorkflowHandle
from durable.errors import NoEngineError


class AsyncDebounces(DebounceSpec[P, R]):
    """A Debouncer's debounce (the awaited one)."""

    async def debounce_async(
        self, key: str, /, *args: P.args, **kwargs: P.kwargs
    ) -> AsyncWorkflowHandle:
        """Start the workflow for `key` once the key has been quiet for `period` seconds,
        with these arguments unless a later debounce replaces them; returns the handle of
        the run that will get them. On the current engine (`with engine:`, or the engine
        running the calling workflow); a process with only a Client calls
        `client.debounce(debouncer, key, ...)`. From workflow code the debounce is a step:
        a replay returns the same handle without debouncing again. (debounce_async, awaited,
        in async code: an AsyncWorkflowHandle.)"""
        engine = current_engine.get()
        if engine is None:
            raise NoEngineError()
        client = engine.client
        if True:  # ASYNC
            run = async_run("Debouncer.debounce_async()")
        else:
            run = sync_run("Debouncer.debounce()")
        if run is not None:
            # A bad call fails here, not as a step.
            client.inputs.encode(self.defn, (*self._receiver, *args), kwargs)
            step_args = (client, self, key, args, kwargs)
            workflow_id = await _driver_async.call_step(_STEP_ASYNC, step_args, {})
        else:
            workflow_id = await debounce_async(client, self, key, args, kwargs)
        return AsyncWorkflowHandle(client, workflow_id)


async def debounce_async(
    client: Recorder,
    debouncer: DebounceSpec[Any, Any],
    key: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """Debounce one start (see Debouncer); the id of the entry that will run it (one short
    transaction, in a thread on the async side)."""
    return await to_thread_async(record, client, debouncer, key, args, kwargs)


async def _debounce_step_async(
    client: Recorder,
    debouncer: DebounceSpec[Any, Any],
    key: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    return await debounce_async(client, debouncer, key, args, kwargs)


# A debounce from workflow code is a step of the workflow (journaled under this name): its
# output, the id of the entry it reached, is what a replay returns. Like any step it runs
# at least once: a crash between the debounce and its journal row debounces again.
_STEP_ASYNC = StepDef(name=labels.DEBOUNCE_STEP, fn=_debounce_step_async)


if True:  # ASYNC
    from durable._client.debounce import Debounces

    class Debouncer(Debounces[P, R], AsyncDebounces[P, R]):
        """Starts `workflow` once per quiet period of a key, with the last inputs given.

        `debouncer.debounce(key, *args, **kwargs)` records a start of the workflow that
        waits `period` seconds; debouncing the same key again before it started replaces
        its inputs and pushes its start back to `period` seconds from now, so a burst of
        calls runs once, with the last call's arguments, after the key has been quiet for
        `period`. Once the run started, the next debounce of the key waits for a run of its
        own. `max_wait` (seconds, default None: no bound) caps how long a stream of calls
        can postpone a run, counted from the first debounce of the period. This holds
        across processes: the key is taken under a row lock in the database. The entry
        waits on `queue` (default: an internal queue "durable.debounce"), so any worker
        that imports the debouncer's module runs it, within that queue's limits.

        Declare it once at import time, like a queue, next to the workflow.
        """
