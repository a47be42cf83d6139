"""Patching: changing a workflow's code under runs that started on the old code.

`patched(id)` answers, at one point of the workflow, which branch this run takes. A run
that reaches the point on code that has the patch journals a marker there and takes the
new branch; a run replaying a journal written before the patch finds another call at that
position (what the old code did next) and takes the old branch, so its replay meets the
calls it recorded and raises no NondeterminismError. A replay of a run that took the new
branch finds its marker. The first answer for an id holds for the rest of the run.

`deprecate_patch(id)` is for the deploy after, once no run from before the patch is left:
the old branch is gone, and the marker of a run that took the new branch is passed over
where it stands (a run started on this code journals none). When no run with a marker is
left either, the call goes too. Temporal's patched/deprecate_patch semantics.
"""

from __future__ import annotations

from durable import _labels as labels
from durable._models import StepKind
from durable._protocol.journal import record
from durable._protocol.ops import Gen
from durable._protocol.run import Run


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
    # Beyond the journal: this run reaches the point for the first time, on patched code.
    journal.next_seq += 1
    run.patches[patch_id] = True
    yield from record(run, seq, label, StepKind.PATCH, None, lazy=True)
    return True


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
