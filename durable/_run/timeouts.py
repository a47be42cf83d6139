"""Per-call workflow timeouts: `timeout=` on one start, and `durable.workflow_timeout()`
for the starts made inside a `with` block (DBOS's SetWorkflowTimeout).

A workflow's timeout is stored with it when it is recorded (`timeout_seconds`) and
counts from its first start, across crashes and waits, as `@durable.workflow(timeout=)`
does: a per-call value only replaces the decorator's for that one workflow. A child
started by a workflow with a deadline never outlives it: its timeout is cut to what is
left of its parent's at the moment it is recorded (and a parent that times out cancels
its children anyway).

A `with durable.workflow_timeout(s):` block applies to the starts made by the code that
entered it: outside any workflow, or in one workflow's own code (its children). The
workflows started there run in contexts of their own and do not pass it on to theirs.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from durable._run.context import current_run
from durable._run.start_options import check_timeout

# (seconds, the run whose code entered the block, or None outside any run)
_scope: ContextVar[tuple[float, object | None] | None] = ContextVar(
    "durable_workflow_timeout", default=None
)


@contextmanager
def workflow_timeout(seconds: float | dt.timedelta) -> Iterator[None]:
    """Give the workflows started inside this block (engine.start, submit, enqueue,
    durable.start_child, ... and their `_async` twins) a timeout of `seconds` from their
    first start, in place of their decorator's. Inside a workflow's code it applies to the
    children that code starts; a child's timeout never outlasts its parent's deadline."""
    token = _scope.set((check_timeout(seconds), current_run.get()))
    try:
        yield
    finally:
        _scope.reset(token)


def pop_timeout(kwargs: dict[str, Any]) -> float | None:
    """A start's own `timeout=`, popped from the keyword arguments meant for the workflow
    (as `workflow_id=` is), and checked."""
    value = kwargs.pop("timeout", None)
    return None if value is None else check_timeout(value)


@contextmanager
def call_timeout(seconds: float | None) -> Iterator[None]:
    """workflow_timeout(seconds) around one start, or nothing when it gave none."""
    if seconds is None:
        yield
        return
    with workflow_timeout(seconds):
        yield


def timeout_for(declared: float | None, parent: tuple[str, int] | None) -> float | None:
    """The timeout a workflow is recorded with: the block's (or call's) when the starting
    code is in one, else its decorator's; for a child, cut to its parent's time left."""
    seconds = declared
    scoped = _scope.get()
    run = current_run.get()
    if scoped is not None and scoped[1] is run:
        seconds = scoped[0]
    if parent is not None and run is not None and run.workflow_id == parent[0]:
        if run.deadline is not None:
            left = (run.deadline - run.settings.clock.now()).total_seconds()
            # A parent already past its deadline stops at its next call; the child's
            # timeout stays positive (the column refuses zero).
            seconds = min(math.inf if seconds is None else seconds, max(left, 0.001))
    return seconds
