"""Patching: changing a workflow's code under runs that started on the old code.

`patched(id)` answers, at one point of the workflow, which branch this run takes. A run
that reaches the point on code that has the patch journals a marker there and takes the
new branch; a run replaying a journal written before the patch finds another call at that
position (what the old code did next) and takes the old branch, so its replay meets the
calls it recorded and raises no NondeterminismError. A replay of a run that took the new
branch finds its marker. The first answer for an id holds for the rest of the run.

A run that an earlier process left inside a call at that position (on the old code: an
effect's intent written, a gate asked, a child started under any id, a message delivered,
a transaction committed in a separate application database, but no journal row yet) takes
the old branch too, so that call replays as the old code's instead of being made again
under the next position. What was started at a position is found by what the rows say
(a child's parent and position, a message's sender and position), never by the name the
call would have derived: a child started under an id of its own is found all the same.

`deprecate_patch(id)` is for the deploy after, once no run from before the patch is left:
the old branch is gone, and the marker of a run that took the new branch is passed over
where it stands (a run started on this code journals none). When no run with a marker is
left either, the call goes too. Temporal's patched/deprecate_patch semantics.
"""

from __future__ import annotations

from durable._base import labels
from durable._base.models import StepKind
from durable._core.journal import record
from durable._core.ops import AppBegin, AppEnd, AppExecute, Execute, Gen
from durable._core.run import Run


def patched(run: Run, patch_id: str) -> Gen[bool]:
    """True: take the patch's new branch (the marker is journaled, or found); False: the
    journal was written before the patch, take the old branch (no position is taken)."""
    known = run.patches.get(patch_id)
    if known is not None:
        return known
    label = labels.patch(patch_id)
    journal = run.journal
    seq = journal.next_seq
    if journal.replaying_at(seq):
        found = journal.records.get(seq)
        taken = found is not None and found.step_name == label
        if taken:
            journal.next_seq += 1
        run.patches[patch_id] = taken
        return taken
    if not run.first_run and (yield from _started_at(run, seq)):
        # An earlier run, on code from before the patch, was cut off inside a call at this
        # position (an effect it may have made, a child it started, a gate it asked): that
        # call is the old branch's, and replays as such.
        run.patches[patch_id] = False
        return False
    # Beyond the journal: this run reaches the point for the first time, on patched code.
    journal.refuse_if_diverged()
    journal.next_seq += 1
    run.patches[patch_id] = True
    yield from record(run, seq, label, StepKind.PATCH, None, lazy=True)
    return True


def _started_at(run: Run, seq: int) -> Gen[bool]:
    """Whether a call at `seq` left its mark before its journal row, found by what the rows
    say, not by the names the call would have given them: an effect's intent or an
    approval gate (the workflow's own rows), a child started there under any id (its row
    names its parent and the position), a message delivered from there (its row names its
    sender and the position), or a transaction committed in a separate application
    database (its `transaction_outputs` row). A transaction in the system database commits
    with its journal row, so it leaves no such mark."""
    params = {"workflow_id": run.workflow_id, "step_seq": seq}
    row = yield Execute("patch_point_started", params, "one")
    if row is not None and row["started"]:
        return True
    if (yield Execute("child_started_at", params, "one")) is not None:
        return True
    if (yield Execute("message_sent_at", params, "one")) is not None:
        return True
    if run.settings.app_separate:
        yield AppBegin(None)
        try:
            committed = yield AppExecute("app_get_transaction", params, "one")
        except GeneratorExit:
            raise
        except BaseException:
            yield AppEnd(commit=False)  # nothing to keep: the transaction only read
            raise
        yield AppEnd(commit=False)
        if committed is not None:
            return True
    return False


def deprecate_patch(run: Run, patch_id: str) -> None:
    """Pass over the patch's marker if the journal has it here (a run that took the new
    branch before the patch was deprecated); journal nothing."""
    if patch_id in run.patches:
        return
    journal = run.journal
    found = journal.records.get(journal.next_seq) if journal.records else None
    if found is not None and found.step_name == labels.patch(patch_id):
        journal.next_seq += 1
    run.patches[patch_id] = True
