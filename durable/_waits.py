"""Waiting without a process: approval gates (and, later, sleeps and messages).

A wait is journaled like a step. The first time a workflow reaches it, the engine records
the request and suspends the workflow in one fenced write: the row becomes SUSPENDED with
no owner, and the run unwinds (WorkflowSuspended), freeing its worker slot and thread.
Whatever ends the wait — a decision, a timeout — sets the workflow back to PENDING; any
worker claims it and replays it to the wait, which now finds its answer, journals it and
returns. Crash recovery and deliberate pauses are the same machinery.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from durable._context import RunContext, current_run
from durable._durability import flush_run
from durable._executor import check_interrupt, record_step
from durable._models import StepKind
from durable.errors import InvalidWaitError, NoEngineError, StaleOwnerError, WorkflowSuspended
from durable.serialization import dumps_checked


@dataclass(frozen=True)
class Decision:
    """The outcome of an approval gate.

    approved: whether the action may go ahead.
    comment: what the person wrote (None if nothing, or on timeout).
    decided_by: who decided (None on timeout).
    timed_out: True when nobody decided in time and the gate's default decided.
    """

    approved: bool
    comment: str | None = None
    decided_by: str | None = None
    timed_out: bool = False


def _decision(row: dict[str, Any]) -> Decision:
    status = row["status"]
    if status == "timed_out":
        return Decision(bool(row["default_approved"]), None, None, True)
    return Decision(status == "approved", row["comment"], row["decided_by"], False)


def approval(
    name: str,
    payload: Any = None,
    *,
    timeout: float | dt.timedelta | None = None,
    default: bool = False,
) -> Decision:
    """Wait, durably, for a person to approve or deny `name`; return the Decision.

    The workflow is suspended while it waits (no worker slot is held) and resumes on
    `engine.decide(...)` or `durable approvals approve|deny`. With `timeout`, nobody
    deciding in time decides `default`. On replay the recorded decision is returned.
    """
    run = current_run.get()
    if run is None or run.in_step:
        raise NoEngineError("durable.approval() must be called from a workflow (not a step)")
    engine = run.engine
    seq, record = run.journal.next_call(f"approval:{name}")
    if record is not None:
        assert record.output is not None
        return Decision(**engine.serializer.loads(record.output))
    check_interrupt(run)
    flush_run(run)  # barrier: suspending writes what the run still holds
    ids = {"workflow_id": run.workflow_id, "name": name}
    row = engine.db.fetch_one("get_approval", ids)
    if row is None:
        seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
        written = engine.db.execute_on(
            run.conn,
            "approval_request",
            {
                **ids,
                "epoch": run.epoch,
                "step_seq": seq,
                "payload": dumps_checked(
                    engine.serializer,
                    payload,
                    f"the payload of approval {name!r}",
                    engine.max_payload_bytes,
                ),
                "default_approved": default,
                "timeout_seconds": seconds,
            },
        )
        if written == 0:
            raise StaleOwnerError(run.workflow_id, run.epoch)
    elif row["status"] != "waiting":
        return _journal(run, seq, name, _decision(row))
    if engine.db.execute_on(run.conn, "suspend_for_approval", {**ids, "epoch": run.epoch}):
        raise WorkflowSuspended(run.workflow_id)
    # Not suspended: either decided meanwhile, or we lost ownership.
    row = engine.db.fetch_one("get_approval", ids)
    if row is not None and row["status"] != "waiting":
        return _journal(run, seq, name, _decision(row))
    raise StaleOwnerError(run.workflow_id, run.epoch)


def _journal(run: RunContext, seq: int, name: str, decision: Decision) -> Decision:
    output = run.engine.serializer.dumps(asdict(decision))
    record_step(run, seq, f"approval:{name}", StepKind.APPROVAL, output, None, 1, None)
    return decision


# -- durable sleep and messages ----------------------------------------------------------------

_SLEEP_IN_PLACE = 1.0  # seconds: shorter waits sleep in the thread instead of suspending


def _seconds(value: float | dt.timedelta, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if seconds < 0 or seconds != seconds:  # negative or NaN
        raise InvalidWaitError(
            f"{what}={value!r}: give a duration of zero or more seconds (a number or a "
            "datetime.timedelta)"
        )
    return seconds


def _deadline(run: RunContext, label: str, seconds: float) -> dt.datetime:
    """Journal (or replay) the time a wait ends, so a resume never waits again for the part
    already waited."""
    seq, record = run.journal.next_call(label)
    if record is not None:
        assert record.output is not None
        return dt.datetime.fromisoformat(run.engine.serializer.loads(record.output))
    wake_at = run.engine.clock.now() + dt.timedelta(seconds=seconds)
    output = run.engine.serializer.dumps(wake_at.isoformat())
    record_step(run, seq, label, StepKind.SLEEP, output, None, 1, None)
    return wake_at


def _suspend(run: RunContext, wake_at: dt.datetime | None, topic: str | None) -> bool:
    """Park the workflow; False if a message it waits for arrived meanwhile."""
    # A cancel or timeout seen while waiting ends the wait (workers wake a suspended
    # workflow at its deadline, whatever it waits for).
    check_interrupt(run)
    flush_run(run)
    suspended = run.engine.db.execute_on(
        run.conn,
        "suspend_until",
        {"workflow_id": run.workflow_id, "epoch": run.epoch, "wake_at": wake_at, "topic": topic},
    )
    if suspended:
        raise WorkflowSuspended(run.workflow_id)
    if topic is None:
        raise StaleOwnerError(run.workflow_id, run.epoch)
    return False


def sleep(seconds: float | dt.timedelta) -> None:
    """Sleep durably: the wake-up time is journaled first; a long sleep suspends the workflow
    (no worker slot, no thread) and any worker resumes it when it is due, even after every
    worker restarted. A resumed workflow only sleeps what is left."""
    duration = _seconds(seconds, "seconds")
    run = current_run.get()
    if run is None or run.in_step:
        raise NoEngineError("durable.sleep() must be called from a workflow (not a step)")
    wake_at = _deadline(run, "sleep", duration)
    remaining = (wake_at - run.engine.clock.now()).total_seconds()
    if remaining <= 0:
        return
    if remaining <= _SLEEP_IN_PLACE and run.engine.clock.is_system:
        import time

        check_interrupt(run)
        time.sleep(remaining)
        return
    _suspend(run, wake_at, None)


def recv(topic: str | None = None, timeout: float | dt.timedelta | None = None) -> Any:
    """Receive the oldest message sent to this workflow on `topic`, or None on timeout.

    The message is consumed in the same statement that journals this step, so it is
    consumed exactly once, across crashes. While nothing is there the workflow suspends."""
    run = current_run.get()
    if run is None or run.in_step:
        raise NoEngineError("durable.recv() must be called from a workflow (not a step)")
    topic_key = topic or ""
    deadline = (
        None
        if timeout is None
        else _deadline(run, f"recv-deadline:{topic_key}", _seconds(timeout, "timeout"))
    )
    label = f"recv:{topic_key}"
    seq, record = run.journal.next_call(label)
    if record is not None:
        return None if record.output is None else run.engine.serializer.loads(record.output)
    check_interrupt(run)
    engine = run.engine
    flush_run(run)
    while True:
        row = None
        with engine.db.cursor_on(run.conn) as cur:
            cur.execute(
                engine.db.query("consume_message"),
                {
                    "workflow_id": run.workflow_id,
                    "epoch": run.epoch,
                    "topic": topic_key,
                    "step_seq": seq,
                    "step_name": label,
                },
            )
            row = cur.fetchone()
        if row is not None:
            engine.crash_point("after_recv")
            return engine.serializer.loads(row[0])
        if deadline is not None and run.engine.clock.now() >= deadline:
            record_step(run, seq, label, StepKind.RECV, None, None, 1, None)
            return None
        if not _suspend(run, deadline, topic_key):
            continue  # a message arrived between the check and the suspend


def set_event(key: str, value: Any) -> None:
    """Publish `value` under `key` for readers outside the workflow (engine.get_event)."""
    run = current_run.get()
    if run is None or run.in_step:
        raise NoEngineError("durable.set_event() must be called from a workflow (not a step)")
    label = f"event:{key}"
    seq, record = run.journal.next_call(label)
    if record is not None:
        return
    check_interrupt(run)
    engine = run.engine
    text = dumps_checked(
        engine.serializer, value, f"the value of event {key!r}", engine.max_payload_bytes
    )
    flush_run(run)
    written = engine.db.execute_on(
        run.conn,
        "set_event",
        {
            "workflow_id": run.workflow_id,
            "epoch": run.epoch,
            "step_seq": seq,
            "step_name": label,
            "key": key,
            "value": text,
        },
    )
    if written == 0:
        raise StaleOwnerError(run.workflow_id, run.epoch)
