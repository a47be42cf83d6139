"""Children started from workflow code and waited for later, and waiting for the first of
several things (DBOS's `start_workflow` inside a workflow, and more).

`durable.start_child(fn, ...)` (in `_client/starts.py`) starts a child, journaled where it is
called, so a replay hands back the same child, and returns a ChildHandle at once
(`_run/child_handle.py`); the parent goes on, and `handle.result()` later waits for the
child's outcome as one journaled call of the parent: a replay returns the recorded value
(or raises the recorded failure) without waiting. `durable.wait_first([...])` waits for
whichever of messages, approvals, timers and children is ready first, and journals which
one won, so a replay picks the same. Both park the workflow while they wait (no worker
slot, no thread, no connection): a message, a decision, the time or a child's end wakes
it. The decisions are in `_core.first`; these are the public functions that drive
them.

This module is the source of the awaited forms, for async workflows; `_run/children.py`, the
plain ones, is generated from it by tools/async_to_sync.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from durable import _core as protocol
from durable._base.models import Winner
from durable._base.names import check_name
from durable._core import OnApproval, OnChild, OnMessage, OnTimer
from durable._core.first import Condition
from durable._run.acompat import workflow_run_async
from durable._run.driver_async import drive_async
from durable._run.waits_async import _seconds
from durable.errors import InvalidWaitError


class AsyncChildResult:
    """Waiting for a child started with durable.start_child() (a ChildHandle's awaited
    wait; `_children.ChildResult` has the plain one)."""

    _condition: OnChild

    async def result_async(self) -> Any:
        """Wait for the child to end; return its value, or raise WorkflowFailedError /
        WorkflowCancelledError (WorkflowTimeoutError) as its handle's result() would. The
        outcome is journaled in the parent: a replay returns or raises it at once. (In an
        async workflow: `await handle`, or `await handle.result_async()`.)"""
        run = workflow_run_async("ChildHandle.result()")
        return await drive_async(run, protocol.child_result(run, self._condition))


def on_message(topic: str | None = None) -> OnMessage:
    """A condition of wait_first: a message on `topic`. It is consumed only if it wins;
    a message on a losing topic stays for a later recv (or wait_first)."""
    check_name("topic", topic, optional=True)
    return OnMessage(topic)


def on_approval(name: str, payload: Any = None) -> OnApproval:
    """A condition of wait_first: a decision on gate `name` (asked, with `payload`, when
    the wait starts; its value is the durable.Decision). A gate that loses stays open: a
    later approval(name) or on_approval(name) in this workflow gets its decision."""
    check_name("name", name)
    return OnApproval(name, payload)


def on_timer(seconds: float | dt.timedelta) -> OnTimer:
    """A condition of wait_first: `seconds` after the wait first started (its value is
    None). The time is journaled, so a resumed wait does not start over."""
    return OnTimer(_seconds(seconds, "seconds"))


Waitable = OnMessage | OnApproval | OnTimer | AsyncChildResult


def _conditions(conditions: Sequence[Waitable]) -> list[Condition]:
    found: list[Condition] = []
    for item in conditions:
        if isinstance(item, AsyncChildResult):  # a ChildHandle
            found.append(item._condition)
        elif isinstance(item, OnMessage | OnApproval | OnTimer):
            found.append(item)
        else:
            raise InvalidWaitError(
                f"wait_first got {item!r}: give durable.on_message(...), "
                "durable.on_approval(...), durable.on_timer(...) or a ChildHandle"
            )
    if not found:
        raise InvalidWaitError("wait_first([]) would wait forever: give one condition or more")
    return found


async def wait_first_async(conditions: Sequence[Waitable]) -> Winner:
    """Wait for the first of `conditions` to be ready and return which one won and its
    value (a Winner). The win is journaled: a replay returns the same winner and value
    without waiting. Conditions are looked at in the order given, so when several are
    ready the first listed wins. The losers are left as they are: an unconsumed message
    stays for a later recv, an approval gate stays open, a child keeps running (its
    handle can still be waited for). A child that wins with a failure raises it. While
    nothing is ready the workflow parks (no worker slot, no thread). (`await
    durable.wait_first_async([...])` in an async workflow.)"""
    found = _conditions(conditions)
    run = workflow_run_async("durable.wait_first()")
    return Winner(*(await drive_async(run, protocol.wait_first(run, found))))
