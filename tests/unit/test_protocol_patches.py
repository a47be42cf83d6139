"""durable.patched() and deprecate_patch(): which branch a run takes at a patch point, by
what its journal holds there. No database: the journal is scripted."""

from __future__ import annotations

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable.errors import NondeterminismError
from tests.unit.scripted import Script, done, make_run, step_def


def fetch() -> str:
    return "page"


def marker(seq: int, patch_id: str) -> StepRecord:
    return StepRecord(seq, f"patch:{patch_id}", StepKind.PATCH, None, None, 1)


def test_a_run_that_reaches_the_point_on_patched_code_journals_a_marker() -> None:
    run = make_run()
    script = Script()
    assert script.run(protocol.patched(run, "fix-tax")) is True
    (write,) = script.ops
    assert write.name == "record_step"
    assert write.params["step_seq"] == 0
    assert write.params["step_name"] == "patch:fix-tax"
    assert write.params["kind"] == "patch"
    assert run.journal.next_seq == 1


def test_a_replay_of_a_journal_from_before_the_patch_takes_the_old_branch() -> None:
    # The old code called fetch at position 1, where the patched code asks.
    run = make_run(records=[done(0, "fetch", "a"), done(1, "fetch", "b")])
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is False
    assert run.journal.next_seq == 1  # no position taken: the old call replays there
    assert script.run(protocol.step(run, step_def(fetch), (), {})) == "b"
    assert not [op for op in script.ops if getattr(op, "name", "") == "record_step"]


def test_a_replay_of_a_run_that_took_the_patch_finds_its_marker() -> None:
    run = make_run(records=[done(0, "fetch", "a"), marker(1, "fix-tax"), done(2, "fetch", "c")])
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is True
    assert script.run(protocol.step(run, step_def(fetch), (), {})) == "c"
    assert script.ops == []  # everything replayed


def test_a_run_cut_off_before_the_patch_point_takes_the_new_branch() -> None:
    # Its journal ends before the point: it never ran the old branch.
    run = make_run(records=[done(0, "fetch", "a")])
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is True
    assert script.ops[-1].params["step_name"] == "patch:fix-tax"


def test_a_gap_before_later_records_is_history_not_the_frontier() -> None:
    # Position 1 is missing but 2 is recorded (a branch of a gather wrote it): the journal
    # was made by the old code, so the old branch is taken.
    run = make_run(records=[done(0, "fetch", "a"), done(2, "fetch", "c")])
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is False


def test_the_first_answer_for_an_id_holds_for_the_run() -> None:
    run = make_run()
    script = Script()
    assert script.run(protocol.patched(run, "loop")) is True
    assert script.run(protocol.patched(run, "loop")) is True
    assert len(script.ops) == 1  # one marker, one position
    old = make_run(records=[done(0, "fetch", "a")])
    assert Script().run(protocol.patched(old, "loop")) is False
    assert Script().run(protocol.patched(old, "loop")) is False


def test_another_patchs_marker_is_not_this_ones() -> None:
    run = make_run(records=[marker(0, "a"), done(1, "fetch", "x")])
    script = Script()
    assert script.run(protocol.patched(run, "b")) is False  # "b" came later than this run
    assert script.run(protocol.patched(run, "a")) is True


def test_deprecate_patch_passes_over_a_marker_and_journals_nothing() -> None:
    with_marker = make_run(records=[marker(0, "fix-tax"), done(1, "fetch", "b")])
    protocol.deprecate_patch(with_marker, "fix-tax")
    assert Script().run(protocol.step(with_marker, step_def(fetch), (), {})) == "b"
    fresh = make_run()
    protocol.deprecate_patch(fresh, "fix-tax")
    assert fresh.journal.next_seq == 0
    script = Script()
    script.run(protocol.step(fresh, step_def(fetch), (), {}))
    assert script.ops[-1].params["step_seq"] == 0


def test_a_marker_with_no_patch_call_left_is_nondeterminism() -> None:
    run = make_run(records=[marker(0, "fix-tax")])
    with pytest.raises(NondeterminismError, match=r"patch:fix-tax.*deprecate_patch\(.fix-tax.\)"):
        Script().run(protocol.step(run, step_def(fetch), (), {}))


def test_a_worker_older_than_the_runs_code_is_told_so() -> None:
    # A rolling deploy: a worker still on the code from before the patch claims a run that
    # took it. The error says that first, with what to do, before the other cause.
    run = make_run(records=[marker(0, "fix-tax")])
    with pytest.raises(NondeterminismError) as info:
        Script().run(protocol.step(run, step_def(fetch), (), {}))
    text = str(info.value)
    assert "worker runs code older than the run's" in text
    assert "version=" in text
    assert text.index("older than the run's") < text.index("removed too early")


def test_a_call_an_earlier_run_started_at_the_point_keeps_the_old_branch() -> None:
    # Cut off inside an effect (its intent written, no journal row yet) on the old code:
    # the effect replays as the old code's, it is not made again after a marker.
    run = make_run(records=[done(0, "fetch", "a")])
    script = Script(statements={"patch_point_started": {"started": True}})
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is False
    assert run.journal.next_seq == 1
    assert script.ops[-1].params == {"workflow_id": "wf-1", "step_seq": 1}


def test_a_child_an_earlier_run_started_at_the_point_keeps_the_old_branch() -> None:
    # Found by the child's row (its parent and position), whatever id the child was given:
    # a child started under an id of its own is found as well as one with a derived id.
    run = make_run(records=[done(0, "fetch", "a")])
    script = Script(statements={"child_started_at": {"started": 1}})
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is False
    assert run.journal.next_seq == 1
    asked = script.ops[-1]
    assert (asked.name, asked.params) == (
        "child_started_at",
        {"workflow_id": "wf-1", "step_seq": 1},
    )
    assert not [op for op in script.ops if getattr(op, "name", "") == "get_workflow_status"]


def test_a_message_an_earlier_run_delivered_at_the_point_keeps_the_old_branch() -> None:
    # The message is the receiver's row; it names its sender and the sender's position.
    run = make_run(records=[done(0, "fetch", "a")])
    script = Script(statements={"message_sent_at": {"sent": 1}})
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is False
    asked = script.ops[-1]
    assert (asked.name, asked.params) == ("message_sent_at", {"workflow_id": "wf-1", "step_seq": 1})


def test_a_transaction_committed_in_the_app_database_keeps_the_old_branch() -> None:
    # A separate application database: its transaction_outputs row commits first, the
    # journal row after; a crash between the two leaves the app-side row as the only mark.
    run = make_run(records=[done(0, "fetch", "a")], app_separate=True)
    committed = {"step_name": "refund", "output": "1", "error": None}
    script = Script(statements={"app_get_transaction": committed})
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is False
    assert script.labels[-3:] == [
        "AppBegin",
        "AppExecute app_get_transaction",
        "AppEnd rollback",
    ]
    assert run.journal.next_seq == 1


def test_nothing_started_at_the_point_takes_the_new_branch_after_asking_everywhere() -> None:
    run = make_run(records=[done(0, "fetch", "a")], app_separate=True)
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is True
    asked = [label for label in script.labels if "record_step" not in label]
    assert asked[-6:] == [
        "Execute patch_point_started",
        "Execute child_started_at",
        "Execute message_sent_at",
        "AppBegin",
        "AppExecute app_get_transaction",
        "AppEnd rollback",
    ]


def test_the_app_database_is_not_asked_when_it_is_the_system_database() -> None:
    # There the transaction's journal row commits with it: no mark without a row.
    run = make_run(records=[done(0, "fetch", "a")])
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.patched(run, "fix-tax")) is True
    assert "AppBegin" not in script.labels


def test_a_first_run_looks_for_nothing() -> None:
    run = make_run(first_run=True)
    script = Script()
    assert script.run(protocol.patched(run, "fix-tax")) is True
    assert [op.name for op in script.ops] == ["record_step"]
