"""Children started from workflow code and waited for later, and waiting for the first of
several things (DBOS's `start_workflow` inside a workflow, and more).

`durable.start_child(fn, ...)` starts a child (journaled where it is called, so a replay
hands back the same child) and returns a ChildHandle at once; the parent goes on, and
`handle.result()` later waits for the child's outcome as one journaled call of the
parent: a replay returns the recorded value (or raises the recorded failure) without
waiting. `durable.wait_first([...])` waits for whichever of messages, approvals, timers
and children is ready first, and journals which one won, so a replay picks the same.
Both park the workflow while they wait (no worker slot, no thread, no connection): a
message, a decision, the time or a child's end wakes it. The decisions are in
`_protocol.first`; these are the public functions that drive them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from durable import _protocol as protocol
from durable._context import workflow_run
from durable._decorators import workflow_def
from durable._driver import drive
from durable._driver_async import drive_async
from durable._names import check_name
from durable._protocol import OnApproval, OnChild, OnMessage, OnTimer
from durable._protocol.first import Condition
from durable._waits import _seconds
from durable.errors import InvalidWaitError

__all__ = [
    "ChildHandle",
    "Winner",
    "on_approval",
    "on_message",
    "on_timer",
    "start_child",
    "start_child_async",
    "wait_first",
    "wait_first_async",
]


class ChildHandle:
    """A child workflow started from workflow code with durable.start_child(). Waiting
    for it (`result()`, or `await handle` / `result_async()` in an async workflow) is a
    journaled call of the parent that parks the parent until the child ends; the handle
    also goes into durable.wait_first() as one of its conditions."""

    def __init__(self, workflow_id: str, name: str, fn: Callable[..., Any] | None) -> None:
        self._condition = OnChild(workflow_id, name, fn)

    @property
    def workflow_id(self) -> str:
        return self._condition.workflow_id

    def result(self) -> Any:
        """Wait for the child to end; return its value, or raise WorkflowFailedError /
        WorkflowCancelledError (WorkflowTimeoutError) as its handle's result() would. The
        outcome is journaled in the parent: a replay returns or raises it at once."""
        run = workflow_run("ChildHandle.result()")
        return drive(run, protocol.child_result(run, self._condition))

    async def result_async(self) -> Any:
        """result(), awaited in an async workflow."""
        run = workflow_run("ChildHandle.result_async()", is_async=True)
        return await drive_async(run, protocol.child_result(run, self._condition))

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result_async().__await__()

    def __repr__(self) -> str:
        return f"ChildHandle({self.workflow_id!r})"


def start_child(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> ChildHandle:
    """Start `fn(*args, **kwargs)` as a child of the calling workflow and return its
    handle without waiting. The start is journaled (the child's id is derived from this
    call's position unless `workflow_id=` is given), so a replay returns the same child.
    `timeout=` gives the child a timeout of its own (cut to what is left of the parent's).
    Only in workflow code: elsewhere, start workflows with engine.start."""
    run = workflow_run("durable.start_child()")
    defn = workflow_def(fn)
    handle = run.host.active.start(fn, *args, **kwargs)
    return ChildHandle(handle.workflow_id, defn.name, defn.fn)


async def start_child_async(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> ChildHandle:
    """start_child(), awaited in an async workflow."""
    run = workflow_run("durable.start_child_async()", is_async=True)
    defn = workflow_def(fn)
    handle = await run.host.active.start_async(fn, *args, **kwargs)
    return ChildHandle(handle.workflow_id, defn.name, defn.fn)


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


@dataclass(frozen=True)
class Winner:
    """What durable.wait_first() returns: the position of the condition that won in the
    list given, and its value (the message, the Decision, None for a timer, the child's
    value). Unpacks as `index, value = durable.wait_first([...])`."""

    index: int
    value: Any

    def __iter__(self) -> Iterator[Any]:
        return iter((self.index, self.value))


Waitable = OnMessage | OnApproval | OnTimer | ChildHandle


def _conditions(conditions: Sequence[Waitable]) -> list[Condition]:
    found: list[Condition] = []
    for item in conditions:
        if isinstance(item, ChildHandle):
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


def wait_first(conditions: Sequence[Waitable]) -> Winner:
    """Wait for the first of `conditions` to be ready and return which one won and its
    value (a Winner). The win is journaled: a replay returns the same winner and value
    without waiting. Conditions are looked at in the order given, so when several are
    ready the first listed wins. The losers are left as they are: an unconsumed message
    stays for a later recv, an approval gate stays open, a child keeps running (its
    handle can still be waited for). A child that wins with a failure raises it. While
    nothing is ready the workflow parks (no worker slot, no thread)."""
    found = _conditions(conditions)
    run = workflow_run("durable.wait_first()")
    return Winner(*drive(run, protocol.wait_first(run, found)))


async def wait_first_async(conditions: Sequence[Waitable]) -> Winner:
    """wait_first(), awaited in an async workflow."""
    found = _conditions(conditions)
    run = workflow_run("durable.wait_first_async()", is_async=True)
    return Winner(*(await drive_async(run, protocol.wait_first(run, found))))
