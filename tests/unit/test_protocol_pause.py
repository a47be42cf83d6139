"""A pause, as the core decides it: a run asked to pause stops at its next new call (the
boundary), is given back PAUSED by the release the hand-over makes, and runs nothing after
it; replayed calls never stop; a cancel goes first, and a pause does not cut an undo short."""

from __future__ import annotations

import pytest

from durable import _core as protocol
from durable._base.models import WorkflowStatus
from durable._core import lifecycle
from durable._run.host_sync import drive
from durable.errors import WorkflowHandedOver, WorkflowInterrupted, WorkflowPaused
from tests.unit import test_lifecycle as scripted_life
from tests.unit.scripted import EPOCH, WORKFLOW_ID, Script, done, make_run, step_def, workflow_def


def test_a_pause_asked_during_a_step_stops_the_run_before_the_next_and_releases_it() -> None:
    asked: set[tuple[str, int]] = set()
    run = make_run(pause_request=lambda wid, epoch: (wid, epoch) in asked)

    def first() -> str:
        asked.add((WORKFLOW_ID, EPOCH))  # the operator's pause, read while the step runs
        return "one"

    def second() -> str:
        raise AssertionError("a step after the pause ran")

    def two_steps() -> str:
        return str(script.run(protocol.step(run, step_def(first), (), {}))) + str(
            script.run(protocol.step(run, step_def(second), (), {}))
        )

    script = Script()
    with pytest.raises(WorkflowPaused) as info:
        script.run(protocol.workflow(run, workflow_def(two_steps), (), {}))
    assert isinstance(info.value, WorkflowHandedOver)  # control flow, never a failure
    assert script.labels == [
        "Call two_steps",
        "Call first",
        "Execute record_step",
        "Join",
        "Execute release_workflow",  # PAUSED, as the row's paused_at says
        "Execute notify_work",
    ]
    assert script.only("release_workflow") == {"workflow_id": WORKFLOW_ID, "epoch": EPOCH}


def test_replayed_calls_never_stop_and_a_request_of_another_run_is_not_this_ones() -> None:
    run = make_run(records=[done(0, "first", "one")], pause_request=lambda wid, epoch: True)
    script = Script()
    # Journaled: it replays without asking.
    assert script.run(protocol.step(run, step_def(lambda: "x", "first"), (), {})) == "one"
    with pytest.raises(WorkflowPaused):
        protocol.check_interrupt(run)  # the next new call stops
    other = make_run(pause_request=lambda wid, epoch: epoch != EPOCH)
    protocol.check_interrupt(other)  # asked of an earlier run of the workflow: goes on


def test_a_cancel_goes_before_a_pause_and_a_pause_does_not_stop_an_undo() -> None:
    run = make_run(cancel="user asked", pause_request=lambda wid, epoch: True)
    with pytest.raises(WorkflowInterrupted) as info:
        protocol.check_interrupt(run)
    assert type(info.value) is WorkflowInterrupted  # the cancel, not the pause
    run.stopping = True  # its compensations run
    protocol.check_interrupt(run)


def test_a_direct_call_whose_run_was_paused_waits_holding_nothing_then_runs_on() -> None:
    """A workflow called as a function (lifecycle.run_here) that an operator pauses: the
    caller looks again with backoff, as for a suspended run, and claims it once unpaused."""
    script = scripted_life.Script(
        (lifecycle.Create, "claim"),
        (lifecycle.RunClaimed, WorkflowPaused("w")),
        (lifecycle.Attach, scripted_life._Info(WorkflowStatus.PAUSED)),
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, None),  # still paused: nobody claims it
        (lifecycle.Sleep, None),
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, "again"),  # unpaused
        (lifecycle.RunClaimed, WorkflowPaused("w")),  # paused once more
        (lifecycle.Finished, (False, None)),
        (lifecycle.Reclaim, "third"),
        (lifecycle.RunClaimed, 42),
    )
    assert drive(lifecycle.run_here(scripted_life.DEFN, "w", "[]", None), script) == 42
    script.done()
