"""durable.wait_first and a child's result() in the pure core: the journaled name says who
won, so a replay returns that winner without a statement; a first run looks in list order
and journals the first ready; nothing ready parks on every condition at once."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable._core import OnApproval, OnChild, OnMessage, OnTimer
from durable.errors import (
    NondeterminismError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowSuspended,
)
from tests.unit.scripted import SERIALIZER, T0, WORKFLOW_ID, Script, Then, done, make_run

CONDITIONS = [OnApproval("refund"), OnMessage("chat"), OnTimer(3600), OnChild("kid", "k")]
WAKE = SERIALIZER.dumps((T0 + dt.timedelta(seconds=3600)).isoformat())


def journal(*records: StepRecord) -> list[StepRecord]:
    return [StepRecord(0, "wait-first-timer", StepKind.SLEEP, WAKE, None, 1), *records]


def test_a_replay_returns_the_journaled_winner_without_a_statement() -> None:
    run = make_run(records=journal(done(1, "wait-first#1 message:chat", "hi", StepKind.RECV)))
    script = Script()
    assert script.run(protocol.wait_first(run, CONDITIONS)) == (1, "hi")
    assert script.labels == []  # not even a look: the winner is the journal's


def test_a_replayed_child_failure_raises_as_its_handle_would() -> None:
    error = protocol.first._failure(protocol.first.WorkflowStatus.ERROR, None)
    record = StepRecord(1, "wait-first#3 child:kid", StepKind.CHILD, None, error, 1)
    with pytest.raises(WorkflowFailedError):
        Script().run(protocol.wait_first(make_run(records=journal(record)), CONDITIONS))
    cancelled = protocol.first._failure(protocol.first.WorkflowStatus.CANCELLED, None)
    record = StepRecord(1, "wait-first#3 child:kid", StepKind.CHILD, None, cancelled, 1)
    with pytest.raises(WorkflowCancelledError):
        Script().run(protocol.wait_first(make_run(records=journal(record)), CONDITIONS))


def test_a_replay_whose_condition_at_the_index_changed_is_nondeterminism() -> None:
    # A message won at #1; the code now waits on a timer and a child there instead: the
    # message must not come back as the timer's None or as the child's value.
    won = done(1, "wait-first#1 message:chat", "hi", StepKind.RECV)
    for changed in (
        [OnMessage("chat"), OnTimer(3600)],
        [OnApproval("refund"), OnChild("kid-2", "k")],
        [OnApproval("refund"), OnMessage("other")],
    ):
        with pytest.raises(NondeterminismError):
            Script().run(protocol.wait_first(make_run(records=journal(won)), changed))


def test_a_child_result_replayed_for_another_child_is_nondeterminism() -> None:
    row = done(0, "child-result:k@kid-1", "kid-1's value", StepKind.CHILD)
    with pytest.raises(NondeterminismError):
        Script().run(protocol.first.child_result(make_run(records=[row]), OnChild("kid-2", "k")))
    same = Script().run(protocol.first.child_result(make_run(records=[row]), OnChild("kid-1", "k")))
    assert same == "kid-1's value"


def test_another_call_at_the_position_is_nondeterminism() -> None:
    run = make_run(records=journal(done(1, "recv:chat", "hi", StepKind.RECV)))
    with pytest.raises(NondeterminismError):
        Script().run(protocol.wait_first(run, CONDITIONS))


def test_the_first_ready_in_list_order_wins_and_consumes_in_its_journal_row() -> None:
    script = Script(
        statements={
            "get_approval": Then(None, {"status": "waiting"}),
            "consume_message": {"output": SERIALIZER.dumps("hi")},
        }
    )
    assert script.run(protocol.wait_first(make_run(), CONDITIONS)) == (1, "hi")
    consumed = script.only("consume_message")
    assert consumed["step_seq"] == 1 and consumed["step_name"] == "wait-first#1 message:chat"
    assert "Execute get_workflow_status" not in script.labels  # the child (listed later)


def test_nothing_ready_parks_on_every_condition_at_once() -> None:
    running: dict[str, Any] = {"status": "RUNNING", "output": None, "error": None}
    script = Script(
        statements={
            "get_approval": Then(None, {"status": "waiting"}, {"status": "waiting"}),
            "get_workflow_status": running,
        }
    )
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), CONDITIONS))
    parked = script.only("suspend_for_any")
    assert parked["topics"] == ["chat"] and parked["gates"] == ["refund"]
    # The earliest of the timer and the look again at the child.
    assert parked["wake_at"] == T0 + dt.timedelta(seconds=protocol.first.CHILD_RECHECK)
    assert parked["workflow_id"] == WORKFLOW_ID
    assert script.labels[-2:] == ["Execute wake_if_any", "Execute get_workflow_status"]
