# Generated from durable/_client/debounce_async.py by tools/async_to_sync.py: do not edit.
# Edit the source, then run `python tools/async_to_sync.py`
# (tests/unit/test_generated_sync.py fails while this file is out of date).
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
from durable._client.starts import Recorder
from durable._run import driver as _driver
from durable._run.acompat import to_thread
from durable._run.context import current_engine, sync_run
from durable._run.handles import WorkflowHandle
from durable.errors import NoEngineError


class Debounces(DebounceSpec[P, R]):
    """A Debouncer's debounce (the awaited one)."""

    def debounce(self, key: str, /, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle:
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
        run = sync_run("Debouncer.debounce()")
        if run is not None:
            # A bad call fails here, not as a step.
            client.inputs.encode(self.defn, (*self._receiver, *args), kwargs)
            step_args = (client, self, key, args, kwargs)
            workflow_id = _driver.call_step(_STEP_ASYNC, step_args, {})
        else:
            workflow_id = debounce(client, self, key, args, kwargs)
        return WorkflowHandle(client, workflow_id)


def debounce(
    client: Recorder,
    debouncer: DebounceSpec[Any, Any],
    key: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """Debounce one start (see Debouncer); the id of the entry that will run it (one short
    transaction, in a thread on the async side)."""
    return to_thread(record, client, debouncer, key, args, kwargs)


def _debounce_step(
    client: Recorder,
    debouncer: DebounceSpec[Any, Any],
    key: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    return debounce(client, debouncer, key, args, kwargs)


# A debounce from workflow code is a step of the workflow (journaled under this name): its
# output, the id of the entry it reached, is what a replay returns. Like any step it runs
# at least once: a crash between the debounce and its journal row debounces again.
_STEP_ASYNC = StepDef(name=labels.DEBOUNCE_STEP, fn=_debounce_step)
