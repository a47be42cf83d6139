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

from durable._context import current_run
from durable._durability import flush_run
from durable._executor import record_step
from durable._models import StepKind
from durable.errors import NoEngineError, StaleOwnerError, WorkflowSuspended
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


def _journal(run: Any, seq: int, name: str, decision: Decision) -> Decision:
    output = run.engine.serializer.dumps(asdict(decision))
    record_step(run, seq, f"approval:{name}", StepKind.APPROVAL, output, None, 1, None)
    return decision
