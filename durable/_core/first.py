"""Waiting for the first of several things: a message, a decision, a time, a child's end.

durable.wait_first() and a child handle's result() are one journaled call each, whose
journaled name says which condition won (`wait-first#<index> <what>`), so a replay picks the same
winner and returns its value without waiting. The conditions are looked at in the order
given and the first one ready wins: a message is consumed in the statement that journals
the win (a message on a losing topic stays for a later recv), a decision and a child's
outcome are read and journaled, a timer wins once its journaled time has passed.

While none is ready the workflow parks (no worker slot, no thread) until any of them can
be: a message on one of its topics or a decision on one of its gates wakes it (as they
wake recv and approval), its earliest timer is its wake-up time, and a child that
finishes wakes its parent. A child's end is on another workflow's row, which no statement
of the parent's may touch on a sharded schema: the parent looks at its children again
after parking (a child that ended meanwhile wakes it), and also every CHILD_RECHECK
seconds, in case a child's wake-up was lost (a crash right after its finish, or a child
cancelled from outside while it waited).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from durable._base import labels
from durable._base.models import ApprovalStatus, Decision, StepKind, WorkflowStatus
from durable._core.journal import barrier, decode_error, record, restore
from durable._core.ops import Execute, Gen, Park
from durable._core.run import Run, _fenced, check_interrupt
from durable._core.waits import _wake_time, adopt_early
from durable.errors import (
    StaleOwnerError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowSuspended,
    WorkflowTimeoutError,
)

# Seconds between a waiting parent's own looks at its children, should a wake-up be lost.
CHILD_RECHECK = 60.0


@dataclass(frozen=True)
class OnMessage:
    """A message on `topic` (None: the default topic), consumed if it wins."""

    topic: str | None = None


@dataclass(frozen=True)
class OnApproval:
    """A decision on gate `name` (asked with `payload` when the wait starts); its value is
    the durable.Decision."""

    name: str
    payload: Any = None


@dataclass(frozen=True)
class OnTimer:
    """`seconds` after the wait first started (journaled, so a resumed wait does not
    start over); its value is None."""

    seconds: float


@dataclass(frozen=True)
class OnChild:
    """The end of child workflow `workflow_id` (of workflow `name`, whose function's
    return annotation rebuilds the value); its value is the child's, or its failure is
    raised."""

    workflow_id: str
    name: str
    fn: Callable[..., Any] | None = None


Condition = OnMessage | OnApproval | OnTimer | OnChild


def child_result(run: Run, child: OnChild) -> Gen[Any]:
    """A child handle's result(): the child's outcome, journaled as one call of the parent
    (a replay returns or raises it without waiting)."""
    name = labels.child_result(child.name, child.workflow_id)
    _, value = yield from wait_first(run, [child], [name])
    return value


def _what(condition: Condition) -> str:
    """What a condition waits for, as its journaled name says it (see labels.wait_first)."""
    match condition:
        case OnMessage(topic=topic):
            return f"message:{topic or ''}"
        case OnApproval(name=name):
            return f"approval:{name}"
        case OnTimer():
            return "timer"
        case OnChild(workflow_id=workflow_id):
            return f"child:{workflow_id}"


def wait_first(
    run: Run, conditions: Sequence[Condition], names: Sequence[str] | None = None
) -> Gen[tuple[int, Any]]:
    """(index, value) of the first condition ready, journaled under `names[index]`."""
    names = names or [labels.wait_first(i, _what(c)) for i, c in enumerate(conditions)]
    timers = [(c.seconds, i) for i, c in enumerate(conditions) if isinstance(c, OnTimer)]
    # Both positions are taken before the wake-up time is written (see recv).
    waits = run.journal.next_call(labels.WAIT_FIRST_TIMER) if timers else None
    seq, found = run.journal.next_call_of(names)
    wake_at, timer = None, -1
    if timers:
        seconds, timer = min(timers)
        wake_at = yield from _wake_time(run, labels.WAIT_FIRST_TIMER, seconds, waits)
    if found is not None:
        index = names.index(found.step_name)
        return index, _replayed(run, conditions[index], found.output, found.error)
    check_interrupt(run)
    yield from barrier(run)
    for condition in conditions:
        if isinstance(condition, OnApproval):
            yield from _ask(run, condition, seq)
    if any(isinstance(c, OnMessage) for c in conditions):
        yield from adopt_early(run)
    refused = False
    while True:
        for index, condition in enumerate(conditions):
            won = yield from _look(run, condition, seq, names[index], index == timer, wake_at)
            if won is not None:
                run.settings.crash_point("after_wait_first")
                return index, won[0]
        if refused:
            # The park was refused and yet nothing is ready: the fence refused it, so
            # another run owns the workflow now.
            raise StaleOwnerError(run.workflow_id, run.epoch)
        yield from _park(run, conditions, wake_at)
        # Still here: a message or a decision arrived between the looks and the park.
        refused = True


def _ask(run: Run, condition: OnApproval, seq: int) -> Gen[None]:
    """Open gate `condition.name` unless it exists (asked before, maybe decided)."""
    ids = {"workflow_id": run.workflow_id, "name": condition.name}
    if (yield Execute("get_approval", ids, "one")) is not None:
        return
    payload = run.dumps(condition.payload, f"the payload of approval {condition.name!r}")
    asked = {
        **ids,
        "epoch": run.epoch,
        "step_seq": seq,
        "payload": payload,
        "default_approved": False,
        "timeout_seconds": None,
    }
    _fenced((yield Execute("approval_request", asked)), run)


def _look(
    run: Run,
    condition: Condition,
    seq: int,
    name: str,
    is_timer: bool,
    wake_at: dt.datetime | None,
) -> Gen[tuple[Any] | None]:
    """(value,) if `condition` is ready, its win journaled at `seq` as `name`; else None."""
    ids = {"workflow_id": run.workflow_id}
    if isinstance(condition, OnMessage):
        params = {**ids, "epoch": run.epoch, "topic": condition.topic or "", "step_seq": seq}
        row = yield Execute("consume_message", {**params, "step_name": name}, "one")
        return None if row is None else (run.loads(row["output"]),)
    if isinstance(condition, OnApproval):
        row = yield Execute("get_approval", {**ids, "name": condition.name}, "one")
        if row is None or row["status"] == ApprovalStatus.WAITING:
            return None
        decision = Decision.from_row(row)
        text = run.settings.serializer.dumps(asdict(decision))
        yield from record(run, seq, name, StepKind.APPROVAL, text)
        return (decision,)
    if isinstance(condition, OnTimer):
        if not is_timer or wake_at is None or run.settings.clock.now() < wake_at:
            return None
        yield from record(run, seq, name, StepKind.SLEEP, None)
        return (None,)
    row = yield Execute("get_workflow_status", {"workflow_id": condition.workflow_id}, "one")
    if row is None:
        raise WorkflowNotFoundError(condition.workflow_id)
    status = WorkflowStatus(row["status"])
    if not status.is_terminal:
        return None
    output: str | None = row["output"]
    error: str | None = None
    if status is not WorkflowStatus.SUCCESS:
        output, error = None, _failure(status, row["error"])
    yield from record(run, seq, name, StepKind.CHILD, output, error, 1, None, condition.workflow_id)
    return (_replayed(run, condition, output, error),)


def _replayed(run: Run, condition: Condition, output: str | None, error: str | None) -> Any:
    """The value a journaled win hands out (first run and replay alike)."""
    if isinstance(condition, OnMessage):
        return run.loads(output)
    if isinstance(condition, OnApproval):
        return Decision(**run.loads(output))
    if isinstance(condition, OnTimer):
        return None
    if error is not None:
        raise child_error(condition.workflow_id, error)
    return restore(run, output, condition.fn)


def _failure(status: WorkflowStatus, error: str | None) -> str:
    """How a child that did not succeed is journaled in its parent: its status and the
    error it stored, read back by child_error."""
    message = f"child workflow ended as {status.value}"
    if error is not None:
        message = decode_error(error)[1] or message
    return json.dumps(
        {
            "type": "durable.errors.WorkflowFailedError",
            "message": message,
            "traceback": "",
            "child_status": status.value,
            "child_error": error,
        }
    )


def child_error(workflow_id: str, text: str) -> Exception:
    """The error a child's journaled failure raises, as its handle's result() would:
    WorkflowCancelledError (WorkflowTimeoutError) or WorkflowFailedError."""
    data = json.loads(text)
    status, inner = data.get("child_status"), data.get("child_error")
    if status == WorkflowStatus.CANCELLED:
        if inner is not None and decode_error(inner)[0].endswith("WorkflowTimeoutError"):
            return WorkflowTimeoutError(workflow_id)
        return WorkflowCancelledError(workflow_id)
    if inner is not None:
        error_type, message, trace = decode_error(inner)
        return WorkflowFailedError(workflow_id, error_type, message, trace)
    return WorkflowFailedError(workflow_id, str(status), f"ended as {status}")


def _park(run: Run, conditions: Sequence[Condition], wake_at: dt.datetime | None) -> Gen[None]:
    """Suspend until any condition may be ready (WorkflowSuspended); returns if a message
    or decision arrived between the looks and the park."""
    topics = [c.topic or "" for c in conditions if isinstance(c, OnMessage)]
    gates = [c.name for c in conditions if isinstance(c, OnApproval)]
    children = [c.workflow_id for c in conditions if isinstance(c, OnChild)]
    if children:
        recheck = run.settings.clock.now() + dt.timedelta(seconds=CHILD_RECHECK)
        wake_at = recheck if wake_at is None else min(wake_at, recheck)
    ids = {"workflow_id": run.workflow_id, "epoch": run.epoch}
    check_interrupt(run)
    yield from barrier(run)
    if (yield Park()):
        # A sibling parked the run: add this wait's time and look for what arrived
        # before it parked (anything later wakes it).
        yield Execute("join_suspension", {**ids, "wake_at": wake_at})
        yield from _wake_if_ready(run, topics, gates, children)
        raise WorkflowSuspended(run.workflow_id)
    check_interrupt(run)  # asked to stop while the siblings finished
    params = {**ids, "wake_at": wake_at, "topics": topics, "gates": gates}
    if (yield Execute("suspend_for_any", params)):
        run.parked = True
        yield from _wake_if_ready(run, topics, gates, children)
        raise WorkflowSuspended(run.workflow_id)


def _wake_if_ready(run: Run, topics: list[str], gates: list[str], children: list[str]) -> Gen[None]:
    """After parking: what arrived while the park waited for the row (a message or
    decision its snapshot did not see, a child that ended) wakes the workflow now."""
    ids = {"workflow_id": run.workflow_id}
    if topics or gates:
        yield Execute("wake_if_any", {**ids, "topics": topics, "gates": gates})
    for child_id in children:
        row = yield Execute("get_workflow_status", {"workflow_id": child_id}, "one")
        if row is not None and WorkflowStatus(row["status"]).is_terminal:
            yield Execute("wake_workflow", ids)
            return


def wake_parent(run: Run) -> Gen[None]:
    """After a child's outcome is written: wake its parent if it is parked (it may wait
    for this child), and tell the workers."""
    if run.parent_id is None:
        return
    if (yield Execute("wake_workflow", {"workflow_id": run.parent_id})):
        notify = {"channel": run.settings.work_channel, "payload": run.parent_id}
        yield Execute("notify_work", notify, "one")
