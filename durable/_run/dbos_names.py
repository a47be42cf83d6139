"""DBOS's option names, and durable's for each: one table, read by the decorators and by
the calls that start a workflow, so that code ported from DBOS fails with the name to use
(DBOSNameError) rather than with a bare TypeError, or, on a start, with an option taken as
the workflow's own argument. docs/coming-from-dbos.md shows the same table.

The names both libraries share (`name=`, `max_recovery_attempts=` on @workflow,
`isolation_level=` on @transaction, `priority=` on an enqueue) are not here: they work.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from durable.errors import DBOSNameError

#: DBOS's keyword on @DBOS.workflow -> what durable takes instead.
WORKFLOW: Mapping[str, str] = {
    "serialization_type": "Engine(serializer=...) (values are JSON by default, never pickle)",
    "validate_args": "type hints checked by mypy (durable checks a call's arity at start)",
}

#: DBOS's keyword on @DBOS.step -> durable's @durable.step parameter.
STEP: Mapping[str, str] = {
    "retries_allowed": "retries= (a count of retries; 0, the default, retries nothing)",
    "max_attempts": "retries= (the retries after the first attempt: max_attempts - 1)",
    "interval_seconds": "initial_delay= (seconds before the first retry)",
    "backoff_rate": "backoff= (the multiplier of the delay between retries)",
}

#: DBOS's keyword on @DBOS.transaction -> durable's @durable.transaction parameter.
TRANSACTION: Mapping[str, str] = {
    "read_only": "a plain @durable.step for a read (a transaction journals in the write)",
}

#: DBOS's start options (SetWorkflowID, SetWorkflowTimeout, SetEnqueueOptions, a
#: DBOSClient's EnqueueOptions) given as keywords to a start or an enqueue -> durable's.
START: Mapping[str, str] = {
    "queue_name": "durable.Queue(name).enqueue(fn, ...) (or engine.enqueue(queue, fn, ...))",
    "workflow_timeout": "timeout= (seconds or a timedelta)",
    "deduplication_id": "dedup_key= (on an enqueue)",
    "queue_partition_key": "partition_key= (on an enqueue)",
    "app_version": "@durable.workflow(version=...) (and resume(..., version=))",
    "workflow_name": "@durable.workflow(name=...)",
    "max_recovery_attempts": "@durable.workflow(max_recovery_attempts=...)",
}


def refuse(where: str, table: Mapping[str, str], given: Mapping[str, Any]) -> None:
    """Raise DBOSNameError for the first of `given` that is in `table`; a TypeError (as
    Python would) for any other name (`given`: keywords the callee does not take)."""
    for name in given:
        if name in table:
            raise DBOSNameError(where, name, table[name])
    for name in given:
        raise TypeError(f"{where} got an unexpected keyword argument {name!r}")


def refuse_start_options(where: str, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    """A start's keywords go to the workflow: refuse those named like a DBOS start option
    that the workflow has no parameter for (`queue_name=` would otherwise be stored as its
    argument, and fail only when it runs)."""
    names = [name for name in kwargs if name in START]
    if not names:
        return
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    for name in names:
        if name not in params:
            raise DBOSNameError(where, name, START[name])
