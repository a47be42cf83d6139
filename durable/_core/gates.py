"""The one gate that approvals and the budget share: wait for a decision, or suspend.

A gate's request and the workflow's suspension are separate fenced writes; a decision
that lands between them is seen, because a suspension refuses to park a decided gate.
`approval` is the journaled gate behind durable.approval(): its decision is the call's
output, so a replay never asks again.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from durable._base import labels
from durable._base.models import ApprovalStatus, Decision, StepKind
from durable._core.journal import barrier, record
from durable._core.ops import Execute, Gen, Park
from durable._core.run import Run, _fenced, check_interrupt
from durable.errors import StaleOwnerError, WorkflowSuspended

logger = logging.getLogger("durable.protocol")


def gate(
    run: Run,
    name: str,
    seq: int,
    payload: str,
    default: bool = False,
    timeout_seconds: float | None = None,
) -> Gen[Decision]:
    """Wait for a decision on gate `name` (asked at position `seq`): returns it once
    decided, else records the request and suspends the workflow (WorkflowSuspended).

    The request and the suspension are separate fenced writes; a decision that lands
    between them is seen, because a suspension refuses to park a decided gate."""
    yield from barrier(run)  # suspending writes what the run still holds
    ids = {"workflow_id": run.workflow_id, "name": name}
    row = yield Execute("get_approval", ids, "one")
    if row is None:
        asked = {
            **ids,
            "epoch": run.epoch,
            "step_seq": seq,
            "payload": payload,
            "default_approved": default,
            "timeout_seconds": timeout_seconds,
        }
        _fenced((yield Execute("approval_request", asked)), run)
    elif row["status"] != ApprovalStatus.WAITING:
        return Decision.from_row(row)
    elif timeout_seconds is not None:
        # Still waiting on a gate with a timeout: the workflow may have woken at its
        # expiry (its wake_at), with nobody having decided it since. Its run decides it by
        # its default then, as expire_approvals does for every gate on a worker's round:
        # an engine that is not a worker runs no such round, only wakes and claims.
        expired = yield Execute("expire_approval", ids, "one")
        if expired is not None:
            return Decision.from_row(expired)
    if (yield Park()):
        # A sibling parked the run: this gate's request is written, and any decision
        # wakes the workflow; one made before the sibling parked it is looked for now.
        if timeout_seconds is not None:
            # The gate's expiry joins the suspension's wake-up time (see above).
            if row is None:
                row = yield Execute("get_approval", ids, "one")
            if row is not None:
                joined = {"workflow_id": run.workflow_id, "epoch": run.epoch}
                yield Execute("join_suspension", {**joined, "wake_at": row["expires_at"]})
        yield Execute("wake_if_decided", ids)
        raise WorkflowSuspended(run.workflow_id)
    check_interrupt(run)  # asked to stop while the siblings finished
    if (yield Execute("suspend_for_approval", {**ids, "epoch": run.epoch})):
        run.parked = True
        yield Execute("wake_if_decided", ids)  # a decision made during the suspension
        logger.info(
            "workflow %s waits at gate %s",
            run.workflow_id,
            name,
            extra={"event": "gate", "workflow_id": run.workflow_id, "gate": name},
        )
        raise WorkflowSuspended(run.workflow_id)
    # Not suspended: either decided meanwhile, or this run lost ownership.
    row = yield Execute("get_approval", ids, "one")
    if row is not None and row["status"] != ApprovalStatus.WAITING:
        return Decision.from_row(row)
    raise StaleOwnerError(run.workflow_id, run.epoch)


def approval(
    run: Run,
    name: str,
    payload: Any = None,
    *,
    timeout: float | None = None,
    default: bool = False,
) -> Gen[Decision]:
    """durable.approval(): a journaled gate; the decision is the call's output."""
    label = labels.approval(name)
    seq, found = run.journal.next_call(label)
    if found is not None:
        return Decision(**run.loads(found.output))
    check_interrupt(run)
    text = run.dumps(payload, f"the payload of approval {name!r}")
    decision = yield from gate(run, name, seq, text, default, timeout)
    output = run.settings.serializer.dumps(asdict(decision))
    yield from record(run, seq, label, StepKind.APPROVAL, output)
    return decision
