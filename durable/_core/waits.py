"""Durable sleep and receiving messages: wait in place, or suspend the workflow.

A wait's end time is journaled first, so a resume never waits again for what was already
waited. A short sleep pauses in place; anything longer parks the workflow (no slot, no
thread) and is woken by its time or its message. A message is consumed in the statement
that journals it. When parallel branches wait at once, one parks the run and the others
join its suspension.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from durable._base import labels
from durable._base.models import StepKind, StepRecord
from durable._core.journal import barrier, record
from durable._core.ops import Execute, Gen, Park, Pause
from durable._core.run import Run, check_interrupt
from durable.errors import StaleOwnerError, WorkflowSuspended

SLEEP_IN_PLACE = 1.0  # seconds: shorter waits sleep in place instead of suspending


def _wake_time(
    run: Run, label: str, seconds: float, position: tuple[int, StepRecord | None] | None = None
) -> Gen[dt.datetime]:
    """Journal (or replay) the time a wait ends, so a resume never waits again for the part
    already waited. `position`: the one its caller took for it (see recv)."""
    seq, found = run.journal.next_call(label) if position is None else position
    if found is not None:
        return dt.datetime.fromisoformat(run.loads(found.output))
    wake_at = run.settings.clock.now() + dt.timedelta(seconds=seconds)
    output = run.settings.serializer.dumps(wake_at.isoformat())
    yield from record(run, seq, label, StepKind.SLEEP, output)
    return wake_at


def _suspend(run: Run, wake_at: dt.datetime | None, topic: str | None) -> Gen[None]:
    """Park the workflow (WorkflowSuspended); returns if a message it waits for arrived
    meanwhile."""
    # A cancel or timeout seen while waiting ends the wait (workers wake a suspended
    # workflow at its deadline, whatever it waits for).
    check_interrupt(run)
    yield from barrier(run)
    if (yield Park()):
        # A sibling parked the run: wake it by this wait's time too, and by a message on
        # this topic sent before the sibling parked it (any later message wakes it).
        ids = {"workflow_id": run.workflow_id, "epoch": run.epoch}
        yield Execute("join_suspension", {**ids, "wake_at": wake_at})
        if topic is not None:
            yield Execute("wake_if_message", {"workflow_id": run.workflow_id, "topic": topic})
        raise WorkflowSuspended(run.workflow_id)
    check_interrupt(run)  # asked to stop while the siblings finished
    suspended = yield Execute(
        "suspend_until",
        {"workflow_id": run.workflow_id, "epoch": run.epoch, "wake_at": wake_at, "topic": topic},
    )
    if suspended:
        run.parked = True
        if topic is not None:
            # A message sent while this suspension waited for the row lock is invisible to
            # its snapshot: look again, now that it is committed, and wake up if it is here.
            yield Execute("wake_if_message", {"workflow_id": run.workflow_id, "topic": topic})
        raise WorkflowSuspended(run.workflow_id)
    if topic is None:
        raise StaleOwnerError(run.workflow_id, run.epoch)


def sleep(run: Run, seconds: float) -> Gen[None]:
    """The wake-up time is journaled first; a long sleep suspends (no slot, no thread)."""
    wake_at = yield from _wake_time(run, labels.SLEEP, seconds)
    clock = run.settings.clock
    remaining = (wake_at - clock.now()).total_seconds()
    if remaining <= 0:
        return
    if remaining <= SLEEP_IN_PLACE and clock.is_system:
        check_interrupt(run)
        yield Pause(remaining)
        return
    yield from _suspend(run, wake_at, None)


def adopt_early(run: Run) -> Gen[None]:
    """Before this run's first look for a message: the messages sent to its id before the
    workflow existed (send(before_start=True)) join its own, each with the time it was
    sent, so they come first and in order. Once per run: the workflow was committed
    before the run began, so a sender that keeps one after this look finds the workflow
    when it looks again, and moves that message itself (and wakes the run)."""
    if run.early_adopted:
        return
    params = {"workflow_id": run.workflow_id, "wake": False}
    yield Execute("adopt_early_messages", params, "one")
    run.early_adopted = True


def recv(run: Run, topic: str | None, timeout: float | None) -> Gen[Any]:
    """The oldest message on `topic`, consumed in the statement that journals it; or None
    once the timeout passed. Suspends while nothing is there."""
    topic_key = topic or ""
    label = labels.recv(topic_key)
    # Both positions are taken before the deadline is written: branches of a gather
    # start calls while it is, and would take the message's position on this run but not
    # on a replay, where the deadline returns without a write.
    waits = None if timeout is None else run.journal.next_call(labels.recv_deadline(topic_key))
    seq, found = run.journal.next_call(label)
    deadline = None
    if timeout is not None:
        deadline = yield from _wake_time(run, labels.recv_deadline(topic_key), timeout, waits)
    if found is not None:
        return run.loads(found.output)
    check_interrupt(run)
    yield from barrier(run)
    yield from adopt_early(run)
    refused = False
    while True:
        row = yield Execute(
            "consume_message",
            {
                "workflow_id": run.workflow_id,
                "epoch": run.epoch,
                "topic": topic_key,
                "step_seq": seq,
                "step_name": label,
            },
            "one",
        )
        if row is not None:
            run.settings.crash_point("after_recv")
            return run.loads(row["output"])
        if refused:
            # The suspend was refused and yet no message is there: the fence refused both,
            # so another run owns the workflow now.
            raise StaleOwnerError(run.workflow_id, run.epoch)
        if deadline is not None and run.settings.clock.now() >= deadline:
            yield from record(run, seq, label, StepKind.RECV, None)
            return None
        yield from _suspend(run, deadline, topic_key)
        # Still here: a message arrived between the check and the suspend (or the run lost
        # ownership, which the next round tells apart).
        refused = True
