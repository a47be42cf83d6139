"""Child workflows: a deterministic id per call position, and the child's outcome journaled
as one call of the parent.

A child run to its end is recorded with its outcome; one started without waiting is
recorded with its id, so a replay hands back the same child. A child cancelled with its
parent stops the parent too, unrecorded, so a resume runs the child again.

Every start from workflow code (engine.start/start_async, submit, enqueue/enqueue_async,
durable.start_child, a Client's calls) takes one position of the parent's journal
(`place_start`) and journals how it ended there (`record_start`): the child's id once its
row is stored, or the queue's refusal of a dedup key. A refusal is an outcome like any
other: the workflow may catch it and take another branch, and a replay must take the same
one even if the key has been freed since, so it raises the refusal again and enqueues
nothing. Any other error of a start stored nothing and is not journaled: a replay meets it
again (an id held by another workflow, bad arguments) or it was the database's (an outage,
a lost lease), which must not become the call's outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable._base import labels
from durable._base.models import StepKind, StepRecord
from durable._core.budget import refresh_ledger
from durable._core.journal import (
    barrier,
    encode_error,
    rebuild_error,
    record,
    replay,
    restore,
)
from durable._core.ops import Execute, Gen, Outcome, RunChild
from durable._core.run import Run, check_interrupt
from durable.errors import (
    DatabaseUnavailableError,
    NondeterminismError,
    QueueDedupError,
    StaleOwnerError,
    WorkflowCancelledError,
)

if TYPE_CHECKING:
    from durable._base.registry import WorkflowDef

# The key of a journaled dedup refusal (the output of a start that stored no child).
REFUSED = "refused"


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


@dataclass(frozen=True)
class Placed:
    """Where a start from workflow code goes in its parent's journal: its position, the
    child's id there, and whether the start is journaled already (a replay: nothing to
    start, the id is the one journaled)."""

    seq: int
    workflow_id: str
    journaled: bool


def place_start(run: Run, name: str, workflow_id: str | None) -> Placed:
    """Take the next position of the parent's journal for a start of workflow `name`. A
    start journaled there hands back its child; a refusal journaled there is raised again,
    the same typed error, with nothing enqueued; otherwise the child gets `workflow_id`
    or, if none is given, an id derived from the parent and the position, so that a start
    cut off before its journal row (a crash, an outage) finds the child it stored."""
    seq, found = run.journal.next_call(name)
    if found is not None and found.child_workflow_id is not None:
        return Placed(seq, found.child_workflow_id, True)
    if found is not None:
        raise _replayed_refusal(run, found)
    return Placed(seq, workflow_id or labels.child_id(run.workflow_id, seq), False)


def record_start(
    run: Run, placed: Placed, name: str, error: BaseException | None = None
) -> Gen[None]:
    """Journal how the start at `placed` ended: the child's id (`error` None: its row is
    stored), or the queue's refusal of its dedup key. Other errors are not journaled.

    A refusal is journaled as what the call returned, not as a failure (no error, no
    child): a resume forgets the failed calls at the end of a journal so that they run
    again, and this one must not run again."""
    if placed.journaled:
        return
    if error is None:
        run.settings.crash_point("after_child_start")
        output = run.settings.serializer.dumps(placed.workflow_id)
        yield from record(
            run, placed.seq, name, StepKind.CHILD, output, None, 1, None, placed.workflow_id
        )
    elif isinstance(error, QueueDedupError):
        refusal = {"queue": error.queue, "dedup_key": error.dedup_key, "holder": error.workflow_id}
        output = run.settings.serializer.dumps({REFUSED: refusal})
        yield from record(run, placed.seq, name, StepKind.CHILD, output)


def _replayed_refusal(run: Run, found: StepRecord) -> BaseException:
    """What a start journaled without a child raised the first time: a dedup refusal, as
    the same QueueDedupError (code catches it by type)."""
    if found.error is not None:  # not written by a start: a failed call of another kind
        return rebuild_error(found.step_name, found.error)
    stored = restore(run, found.output, None)
    refusal = stored.get(REFUSED) if isinstance(stored, dict) else None
    if not isinstance(refusal, dict):
        recorded = f"{found.step_name} (no child, no refusal)"
        return NondeterminismError(
            run.workflow_id, found.step_seq, recorded, f"a start of {found.step_name}"
        )
    holder = refusal.get("holder")
    return QueueDedupError(
        str(refusal.get("queue")),
        str(refusal.get("dedup_key")),
        None if holder is None else str(holder),
    )


def _stop_if_asked(run: Run) -> Gen[None]:
    """Read this run's cancel request from the database now (not waiting for the poll)."""
    row = yield Execute("get_cancel_request", {"workflow_id": run.workflow_id}, "one")
    if row is not None and row["cancel_reason"] is not None:
        run.cancel_reason = row["cancel_reason"]
        check_interrupt(run)
