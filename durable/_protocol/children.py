"""Child workflows: a deterministic id per call position, and the child's outcome journaled
as one call of the parent.

A child run to its end is recorded with its outcome; one started without waiting is
recorded with its id, so a replay hands back the same child. A child cancelled with its
parent stops the parent too, unrecorded, so a resume runs the child again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durable import _labels as labels
from durable._models import StepKind
from durable._protocol.budget import refresh_ledger
from durable._protocol.journal import barrier, encode_error, record, replay
from durable._protocol.ops import Execute, Gen, Outcome, RunChild
from durable._protocol.run import Run, check_interrupt
from durable.errors import DatabaseUnavailableError, StaleOwnerError, WorkflowCancelledError

if TYPE_CHECKING:
    from durable._registry import WorkflowDef


def child(run: Run, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Gen[Any]:
    """A workflow called from a workflow: a child with a deterministic id, whose outcome is
    journaled as one call of the parent."""
    seq, found = run.journal.next_call(defn.name)
    if found is not None:
        return replay(run, found, defn.fn)
    check_interrupt(run)
    child_id = labels.child_id(run.workflow_id, seq)
    yield from barrier(run)
    started = run.settings.clock.now()
    outcome: Outcome = yield RunChild(defn, child_id, args, kwargs, (run.workflow_id, seq))
    exc = outcome.error
    if exc is not None:
        if isinstance(exc, StaleOwnerError | DatabaseUnavailableError):
            raise exc
        if isinstance(exc, WorkflowCancelledError):
            # Cancelled with its parent: the parent stops too, without journaling the
            # child's outcome, so a resume of the parent runs the child again.
            yield from _stop_if_asked(run)
        yield from record(
            run, seq, defn.name, StepKind.CHILD, None, encode_error(exc), 1, started, child_id
        )
        raise exc
    output, value = run.keep(outcome.value, f"the output of child workflow {defn.name!r}", defn.fn)
    yield from record(run, seq, defn.name, StepKind.CHILD, output, None, 1, started, child_id)
    if run.ledger is not None:
        yield from refresh_ledger(run)  # the child spent from the same ledger
    return value


def child_started(run: Run, name: str) -> tuple[int, str | None]:
    """A child started (or enqueued) without waiting for it: its position, and the id
    journaled there if this is a replay."""
    seq, found = run.journal.next_call(name)
    if found is None:
        return seq, None
    return seq, found.child_workflow_id


def record_child_started(run: Run, seq: int, name: str, workflow_id: str) -> Gen[None]:
    # The child's row is committed, the parent's journal row is not: the one mark of the
    # start is the child's row (patched() finds it there, by parent and position).
    run.settings.crash_point("after_child_start")
    output = run.settings.serializer.dumps(workflow_id)
    yield from record(run, seq, name, StepKind.CHILD, output, None, 1, None, workflow_id)


def _stop_if_asked(run: Run) -> Gen[None]:
    """Read this run's cancel request from the database now (not waiting for the poll)."""
    row = yield Execute("get_cancel_request", {"workflow_id": run.workflow_id}, "one")
    if row is not None and row["cancel_reason"] is not None:
        run.cancel_reason = row["cancel_reason"]
        check_interrupt(run)
