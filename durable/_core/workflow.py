"""One run of a workflow function from its first call to its written outcome.

Decides how a run ends: SUCCESS with its output, ERROR with its failure, its applied
effects undone in reverse when it failed (COMPENSATED, or COMPENSATION_FAILED when an
undo fails), CANCELLED when it was asked to stop or timed out (its descendants cancelled
first), handed back to the pool at a step boundary when its worker is stopping (PAUSED when
an operator paused it: no worker takes it until it is unpaused), or no status
at all when it lost ownership, lost the database or suspended (its owner or recovery decides
then). The outcome is written once, fenced, with the records the run still holds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durable._base.models import WorkflowStatus
from durable._core.budget import open_ledger
from durable._core.first import wake_parent
from durable._core.journal import barrier, encode_error, sent
from durable._core.ops import Call, Execute, Finish, Gen, Join, Outcome, WriteSteps
from durable._core.run import TIMEOUT_REASON, Compensation, Run
from durable._core.transitions import WORKFLOW_TRANSITIONS, assert_transition
from durable.errors import (
    DatabaseUnavailableError,
    NondeterminismError,
    SerializationError,
    SharedEffectLostError,
    StaleOwnerError,
    WorkflowCancelledError,
    WorkflowHandedOver,
    WorkflowInterrupted,
    WorkflowPaused,
    WorkflowSuspended,
    WorkflowTimeoutError,
)

if TYPE_CHECKING:
    from durable._base.registry import WorkflowDef

logger = logging.getLogger("durable.protocol")


def workflow(
    run: Run, defn: WorkflowDef, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Gen[Any]:
    """Run the workflow function under this claim and write its outcome.

    Returns the function's value or raises its exception (after recording it). A
    StaleOwnerError, a DatabaseUnavailableError or a BaseException such as a suspension
    leaves the status alone: its owner (or recovery) decides what happens next. A hand-over
    (WorkflowHandedOver: its worker is stopping) gives the workflow back to the pool, and a
    pause (WorkflowPaused) gives it back PAUSED."""
    try:
        # A claim queued on a worker that is stopping never starts: no code of it runs.
        if run.settings.handing_over():
            raise WorkflowHandedOver(run.workflow_id)
        yield from open_ledger(run, defn.budget)
        outcome: Outcome = yield Call(defn.fn, args, kwargs, body=True)
    except WorkflowHandedOver as over:
        yield Join()  # branches still running finish their steps and stop at the next
        yield from hand_over(run, paused=isinstance(over, WorkflowPaused))
        raise
    except WorkflowInterrupted as stop:
        yield Join()  # branches still running stop at their next step or wait
        raise (yield from _stop(run, defn, stop)) from None
    except WorkflowSuspended:
        yield Join()  # the other branches waiting to park join the suspension
        raise
    # The outcome is written once nothing of the run is still running: a branch that
    # applies an effect after a sibling failed is compensated with the rest.
    yield Join()
    exc = outcome.error
    if exc is not None:
        if isinstance(exc, StaleOwnerError):
            logger.warning(
                "workflow %s: lost ownership (epoch %d), stopping", run.workflow_id, run.epoch
            )
            raise exc
        if isinstance(exc, DatabaseUnavailableError):
            raise exc  # interrupted, not failed: handed back once the database answers
        # Code that does not match the journal undoes nothing: the run ends ERROR with its
        # journal and effects as they are, to be resumed on code that matches.
        if run.compensations and not isinstance(exc, NondeterminismError):
            run.stopping = True  # a cancel or deadline now must not cut the undo short
            yield from compensate(run, exc)
        else:
            yield from finish(run, WorkflowStatus.ERROR, None, encode_error(exc))
        raise exc
    try:
        output, value = run.keep(outcome.value, f"the output of workflow {defn.name!r}", defn.fn)
    except SerializationError as error:
        yield from finish(run, WorkflowStatus.ERROR, None, encode_error(error))
        raise
    run.settings.crash_point("before_workflow_finish")
    try:
        yield from finish(run, WorkflowStatus.SUCCESS, output, None)
    except WorkflowInterrupted as stop:
        # Asked to stop after its last call, before its outcome was written: the cancel
        # wins, as it would have at any call before (and its compensations run).
        raise (yield from _stop(run, defn, stop)) from None
    run.output = output
    return value


def hand_over(run: Run, paused: bool = False) -> Gen[None]:
    """Give the workflow back at a step boundary, for another worker to resume at once:
    the records the run still holds are written first (a barrier), then its claim is
    released (fenced by its epoch, so a claim already lost releases nothing) and idle
    workers are woken. Nothing the run finished runs again: the next run replays it.

    `paused`: an operator paused it. The same release writes PAUSED while the pause stands
    (release_workflow reads it from the row), so no worker takes it until it is unpaused;
    one unpaused meanwhile is given back runnable, and the woken workers take it."""
    yield from barrier(run)
    params = {"workflow_id": run.workflow_id, "epoch": run.epoch}
    if (yield Execute("release_workflow", params)):
        notify = {"channel": run.settings.work_channel, "payload": run.workflow_id}
        yield Execute("notify_work", notify, "one")
    if paused:
        logger.info("workflow %s paused at a step boundary", run.workflow_id)
    else:
        logger.info("workflow %s handed over: its worker is stopping", run.workflow_id)


def _stop(run: Run, defn: WorkflowDef, stop: WorkflowInterrupted) -> Gen[WorkflowCancelledError]:
    """Finish a run that was asked to stop: cancel its descendants, undo what it did (its
    compensations, in reverse), then record CANCELLED. Returns the error for the caller."""
    error: WorkflowCancelledError = (
        WorkflowTimeoutError(run.workflow_id, defn.timeout)
        if stop.timed_out
        else WorkflowCancelledError(run.workflow_id, stop.reason)
    )
    run.stopping = True
    text = encode_error(error)
    # Children still running stop too (a timeout is a cancel of the whole tree).
    yield from cancel_tree(run.workflow_id, stop.reason, text)
    if run.compensations:
        yield from compensate(run, error, WorkflowStatus.CANCELLED)
    else:
        yield from finish(run, WorkflowStatus.CANCELLED, None, text)
    logger.info("workflow %s stopped: %s", run.workflow_id, stop.reason)
    return error


# How many times a cancel asks again for workflows whose row changed between its read and
# its write (each time, another claim, suspend or finish won the race; a few rounds settle).
CANCEL_ROUNDS = 10


def cancel_tree(
    workflow_id: str, reason: str, error: str, statement: str = "cancel_workflows"
) -> Gen[list[dict[str, Any]]]:
    """Cancel a workflow and its descendants; returns the rows written (id, status after,
    epoch). The tree is walked down a level per statement, as a schema sharded by workflow
    id cannot run a recursive query over parent_id; the cancel itself is a compare-and-set
    per workflow (cancel_workflows, or terminate_workflows: CANCELLED at once, nothing
    undone), asked again for those whose row changed meanwhile."""
    tree, level = [workflow_id], [workflow_id]
    seen = {workflow_id}
    while level:
        rows = yield Execute("children_of", {"workflow_ids": level}, "all")
        level = [r["workflow_id"] for r in rows if r["workflow_id"] not in seen]
        seen.update(level)
        tree += level
    done: list[dict[str, Any]] = []
    todo = tree
    for _ in range(CANCEL_ROUNDS):
        rows = yield Execute(
            statement, {"workflow_ids": todo, "reason": reason, "error": error}, "all"
        )
        done += [r for r in rows if r["settled"]]
        todo = [r["workflow_id"] for r in rows if not r["settled"]]
        if not todo:
            break
    return done


def finish(run: Run, status: WorkflowStatus, output: str | None, error: str | None) -> Gen[None]:
    """Write the outcome and release ownership (a barrier first). In exit mode the records
    the run still holds go with the outcome, in one statement and one commit: a crash
    before it loses both (the pure steps run again), after it neither. The statement is
    fenced on the run's claim, so the outcome follows RUNNING."""
    assert_transition(WORKFLOW_TRANSITIONS, WorkflowStatus.RUNNING, status)
    params = {
        "workflow_id": run.workflow_id,
        "epoch": run.epoch,
        "status": status.value,
        "output": output,
        "error": error,
    }
    if run.mode == "exit" and run.pending:
        rows, run.pending = run.pending, []
        # The held records are of calls that ran: the records and the outcome are sent
        # again while the lease may hold. A resend after a first send that committed (its
        # answer lost) writes nothing, as a refused send does: the row, read, tells. (After
        # a refusal the row never shows this run's outcome, so reading it then changes
        # nothing; it happens only when the run lost the workflow or a cancel stands.)
        written = yield from sent(run, WriteSteps(rows, params), [])
        if len(written) < len(rows) and (yield from _finished_here(run, status)):
            written = [run.workflow_id] * len(rows)
        if len(written) < len(rows):
            yield from _refused(run, status, rows)
    else:
        yield from barrier(run)
        if not (yield Finish(params)):
            yield from _refused(run, status)
    if run.settings.observe_finish is not None:
        run.settings.observe_finish(run.name, status.value)
    yield from wake_parent(run)


def _finished_here(run: Run, status: WorkflowStatus) -> Gen[bool]:
    """Whether this run's outcome is written: the workflow at this run's epoch (a claim by
    another would have raised it) with `status` and no owner."""
    # Read again while the lease may hold, when an outage cuts the read off.
    row = yield from sent(
        run, Execute("get_workflow", {"workflow_id": run.workflow_id}, "one"), None
    )
    return (
        row is not None
        and row["epoch"] == run.epoch
        and row["status"] == status.value
        and row["owner"] is None
    )


def _refused(run: Run, status: WorkflowStatus, held: Sequence[dict[str, Any]] = ()) -> Gen[None]:
    """A refused outcome: a SUCCESS refused because a cancel request stands (the run still
    owns the workflow) raises WorkflowInterrupted, so the run stops as cancelled; anything
    else means this run lost the workflow (StaleOwnerError).

    The rule: a cancel requested before the outcome is written wins, even after the last
    call. The check is in the outcome's statement itself, so nothing is read in the common
    case and no request can slip in between a read and the write."""
    if status is WorkflowStatus.SUCCESS:
        params = {"workflow_id": run.workflow_id, "epoch": run.epoch}
        row = yield Execute("finish_refused", params, "one")
        if row is not None:
            reason = str(row["cancel_reason"] or "cancelled")
            run.cancel_reason = reason
            run.pending = list(held)  # not written: they go with the cancelled outcome
            raise WorkflowInterrupted(run.workflow_id, reason, reason == TIMEOUT_REASON)
    raise StaleOwnerError(run.workflow_id, run.epoch)


def compensate(
    run: Run, failure: Exception, final: WorkflowStatus = WorkflowStatus.COMPENSATED
) -> Gen[None]:
    """Undo applied effects in reverse order, each an effect with its own key, then finish.

    Each undo is claimed first on the effect's ledger row, which a fork shares with the
    workflow it was forked from: the first of them to claim it undoes it, and the others
    skip it (an effect is undone at most once, however many workflows replay it as theirs).

    A crash here is safe: on recovery the workflow replays to the same failure, the
    compensations already applied replay from the journal, and the rest run (a claim is
    never released, so each is skipped or run again as it was the first time)."""
    failed_step: str | None = None
    error: Exception | None = None
    for comp in reversed(run.compensations):
        undo = comp.undo
        try:
            if not (yield from _claim_undo(run, comp)):
                continue
        except SharedEffectLostError as lost:
            failed_step = getattr(getattr(undo, "__durable_step__", None), "name", repr(undo))
            error = lost
            break
        outcome: Outcome = yield Call(undo, comp.args, comp.kwargs)
        exc = outcome.error
        if exc is None:
            continue
        if isinstance(exc, StaleOwnerError | DatabaseUnavailableError):
            raise exc
        failed_step = getattr(getattr(undo, "__durable_step__", None), "name", repr(undo))
        error = exc
        break
    run.compensations.clear()
    if error is None:
        text = encode_error(failure)
        if final is WorkflowStatus.CANCELLED:
            # Resume refuses a workflow whose undo ran (it would replay the effects on top
            # of their undo); the stored error says so.
            text = json.dumps({**json.loads(text), "compensated": True})
        yield from finish(run, final, None, text)
        return
    detail = json.loads(encode_error(error))
    detail["message"] = f"compensation {failed_step!r} failed: {detail['message']}"
    detail["failed_compensation"] = failed_step
    detail["original_error"] = json.loads(encode_error(failure))
    yield from finish(run, WorkflowStatus.COMPENSATION_FAILED, None, json.dumps(detail))


def _claim_undo(run: Run, comp: Compensation) -> Gen[bool]:
    """Whether this run undoes the effect: it claimed the undo on the effect's ledger row,
    or had claimed it before a crash. False when another workflow sharing the effect (the
    one it was forked from, or a fork of either) claimed it first, or when no effect was
    applied at that position (a call that found its key applied at an earlier position,
    whose own undo is registered there). StaleOwnerError if this run lost its claim."""
    if comp.applied_in is None or comp.step_seq is None:
        return True
    row = yield Execute(
        "claim_undo",
        {
            "workflow_id": run.workflow_id,
            "epoch": run.epoch,
            "applied_in": comp.applied_in,
            "step_seq": comp.step_seq,
        },
        "one",
    )
    if row is None or not row["owned"]:
        raise StaleOwnerError(run.workflow_id, run.epoch)
    by = row["undone_by"]
    if by == run.workflow_id:
        return True
    if by is None and comp.applied_in != run.workflow_id and not row["ledger"]:
        # The shared effect's ledger is gone: nobody can tell whether it was undone.
        raise SharedEffectLostError(run.workflow_id, comp.applied_in, comp.step_seq)
    logger.info(
        "workflow %s: the effect at %s:%d is %s, not undone again",
        run.workflow_id,
        comp.applied_in,
        comp.step_seq,
        f"undone by {by}" if by is not None else "not applied at that position",
    )
    return False


def register_compensation(
    run: Run,
    undo: Callable[..., Any],
    args: Any,
    kwargs: Any,
    applied_in: str | None = None,
    step_seq: int | None = None,
) -> None:
    """Register the undo of an effect applied at `step_seq` of `applied_in`'s ledger (the
    run's own workflow, or the one a fork copied the call from).

    The undos are kept in the order of the effects' positions, not of their registration:
    effects of concurrent branches (asyncio.gather) finish in an order a replay does not
    repeat, and the undos, effects with positions of their own, must run in the same order
    on every run of the workflow, or a replayed undo's result would be taken for another's.
    An undo without a position (durable.compensate) stays where it was registered."""
    comp = Compensation(undo, tuple(args), dict(kwargs), applied_in, step_seq)
    at = len(run.compensations)
    if step_seq is not None:
        while at > 0:
            before = run.compensations[at - 1].step_seq
            if before is None or before < step_seq:
                break
            at -= 1
    run.compensations.insert(at, comp)
