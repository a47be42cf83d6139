"""durable.wait_first in the pure core, condition by condition: what each look asks the
database, what a won condition journals (name, kind, position, child id), and when a
timer, a decision or a child's end counts as ready."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import Decision, StepKind, StepRecord
from durable._core import OnApproval, OnChild, OnMessage, OnTimer
from durable._core.journal import decode_error, encode_error
from durable.errors import (
    StaleOwnerError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowSuspended,
    WorkflowTimeoutError,
)
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    SERIALIZER,
    T0,
    WORKFLOW_ID,
    FixedClock,
    Script,
    Then,
    approval_row,
    make_run,
)

TEN = SERIALIZER.dumps((T0 + dt.timedelta(seconds=10)).isoformat())


def timer_journal() -> list[StepRecord]:
    """A wait whose timer position (0) was journaled: it ends at T0 + 10 s."""
    return [StepRecord(0, "wait-first-timer", StepKind.SLEEP, TEN, None, 1)]


def status_row(status: str, output: Any = None, error: str | None = None) -> dict[str, Any]:
    return {
        "status": status,
        "output": None if output is None else SERIALIZER.dumps(output),
        "error": error,
        "serializer": "json",
    }


# -- approvals -------------------------------------------------------------------------------


def test_a_gate_is_asked_once_at_the_waits_position_and_not_auto_approved() -> None:
    script = Script(statements={"get_approval": Then(None, None)})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnApproval("refund", {"cents": 5})]))
    asked = script.only("approval_request")
    assert asked == {
        "workflow_id": WORKFLOW_ID,
        "name": "refund",
        "epoch": EPOCH,
        "step_seq": 0,
        "payload": SERIALIZER.dumps({"cents": 5}),
        "default_approved": False,
        "timeout_seconds": None,
    }
    assert script.executed("get_approval")[0] == {"workflow_id": WORKFLOW_ID, "name": "refund"}


def test_a_gate_that_exists_is_not_asked_again() -> None:
    waiting = approval_row("waiting")
    script = Script(statements={"get_approval": Then(waiting, waiting)})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnApproval("refund")]))
    assert script.executed("approval_request") == []


def test_a_refused_gate_request_is_a_lost_fence() -> None:
    script = Script(statements={"get_approval": None, "approval_request": 0})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.wait_first(make_run(), [OnApproval("refund")]))


def test_a_decided_gate_wins_and_journals_the_decision() -> None:
    decided = approval_row("denied", comment="no", decided_by="ann")
    script = Script(statements={"get_approval": Then(decided, decided)})
    index, value = script.run(protocol.wait_first(make_run(), [OnApproval("refund")]))
    assert (index, value) == (0, Decision(False, "no", "ann", False))
    record = script.only("record_step")
    assert record["step_seq"] == 0 and record["step_name"] == "wait-first#0 approval:refund"
    assert record["kind"] == StepKind.APPROVAL.value
    assert SERIALIZER.loads(record["output"]) == asdict(Decision(False, "no", "ann", False))


def test_a_journaled_decision_comes_back_as_a_decision() -> None:
    text = SERIALIZER.dumps(asdict(Decision(True, "ok", "bo", False)))
    won = StepRecord(0, "wait-first#0 approval:refund", StepKind.APPROVAL, text, None, 1)
    script = Script()
    result = script.run(protocol.wait_first(make_run(records=[won]), [OnApproval("refund")]))
    assert result == (0, Decision(True, "ok", "bo", False))


# -- timers ----------------------------------------------------------------------------------


def test_a_timer_wins_once_its_journaled_time_has_come() -> None:
    run = make_run(records=timer_journal(), clock=FixedClock(T0 + dt.timedelta(seconds=10)))
    script = Script()
    assert script.run(protocol.wait_first(run, [OnMessage("chat"), OnTimer(10)])) == (1, None)
    record = script.only("record_step")
    assert record["step_seq"] == 1 and record["step_name"] == "wait-first#1 timer"
    assert record["kind"] == StepKind.SLEEP.value and record["output"] is None


def test_a_timer_not_yet_due_parks_until_its_time() -> None:
    run = make_run(records=timer_journal(), clock=FixedClock(T0 + dt.timedelta(seconds=9)))
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(run, [OnMessage("chat"), OnTimer(10)]))
    assert script.executed("record_step") == []
    assert script.only("suspend_for_any")["wake_at"] == T0 + dt.timedelta(seconds=10)


def test_only_the_earliest_timer_can_win() -> None:
    late = FixedClock(T0 + dt.timedelta(seconds=60))
    run = make_run(records=timer_journal(), clock=late)
    script = Script()
    assert script.run(protocol.wait_first(run, [OnTimer(30), OnTimer(5)])) == (1, None)
    assert script.only("record_step")["step_name"] == "wait-first#1 timer"


def test_a_new_wait_journals_when_its_earliest_timer_ends_before_it_parks() -> None:
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnTimer(30), OnTimer(5)]))
    wake = script.only("record_step")
    assert wake["step_name"] == "wait-first-timer" and wake["step_seq"] == 0
    assert wake["kind"] == StepKind.SLEEP.value
    assert SERIALIZER.loads(wake["output"]) == (T0 + dt.timedelta(seconds=5)).isoformat()
    assert script.only("suspend_for_any")["wake_at"] == T0 + dt.timedelta(seconds=5)


# -- messages --------------------------------------------------------------------------------


def test_a_message_is_consumed_on_its_topic_by_this_run() -> None:
    script = Script(statements={"consume_message": {"output": SERIALIZER.dumps(7)}})
    result = script.run(protocol.wait_first(make_run(), [OnMessage("chat")]))
    assert result == (0, 7)
    assert script.only("consume_message") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "topic": "chat",
        "step_seq": 0,
        "step_name": "wait-first#0 message:chat",
    }


def test_the_default_topic_is_the_empty_one() -> None:
    script = Script(statements={"consume_message": {"output": SERIALIZER.dumps(7)}})
    assert script.run(protocol.wait_first(make_run(), [OnMessage()])) == (0, 7)
    consumed = script.only("consume_message")
    assert consumed["topic"] == "" and consumed["step_name"] == "wait-first#0 message:"


# -- children --------------------------------------------------------------------------------


def test_a_child_that_succeeded_wins_with_its_value_journaled_as_the_childs() -> None:
    script = Script(statements={"get_workflow_status": status_row("SUCCESS", 42)})
    result = script.run(protocol.wait_first(make_run(), [OnChild("kid", "k")]))
    assert result == (0, 42)
    assert script.only("get_workflow_status") == {"workflow_id": "kid"}
    record = script.only("record_step")
    assert record["step_name"] == "wait-first#0 child:kid" and record["step_seq"] == 0
    assert record["kind"] == StepKind.CHILD.value and record["attempts"] == 1
    assert record["child_workflow_id"] == "kid" and record["error"] is None
    assert SERIALIZER.loads(record["output"]) == 42


def test_a_child_that_failed_journals_and_raises_its_error() -> None:
    stored = encode_error(ValueError("no stock"))
    script = Script(statements={"get_workflow_status": status_row("ERROR", error=stored)})
    with pytest.raises(WorkflowFailedError) as caught:
        script.run(protocol.wait_first(make_run(), [OnChild("kid", "k")]))
    assert caught.value.workflow_id == "kid"
    assert caught.value.error_type.endswith("ValueError")
    assert caught.value.error_message == "no stock"
    record = script.only("record_step")
    assert record["output"] is None and record["child_workflow_id"] == "kid"
    journaled = json.loads(record["error"])
    assert journaled == {
        "type": "durable.errors.WorkflowFailedError",
        "message": "no stock",
        "traceback": "",
        "child_status": "ERROR",
        "child_error": stored,
    }


def test_a_child_that_failed_without_an_error_says_how_it_ended() -> None:
    script = Script(statements={"get_workflow_status": status_row("ERROR")})
    with pytest.raises(WorkflowFailedError) as caught:
        script.run(protocol.wait_first(make_run(), [OnChild("kid", "k")]))
    assert caught.value.workflow_id == "kid"
    message = decode_error(script.only("record_step")["error"])[1]
    assert message == "child workflow ended as ERROR"


def test_a_child_still_running_does_not_win() -> None:
    script = Script(statements={"get_workflow_status": status_row("RUNNING")})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnChild("kid", "k")]))
    assert script.executed("record_step") == []


def test_a_child_that_does_not_exist_is_not_found() -> None:
    with pytest.raises(WorkflowNotFoundError) as caught:
        Script().run(protocol.wait_first(make_run(), [OnChild("kid", "k")]))
    assert caught.value.workflow_id == "kid"


def test_a_journaled_child_failure_raises_the_childs_error() -> None:
    failed = protocol.first._failure(
        protocol.first.WorkflowStatus.ERROR, encode_error(KeyError("sku"))
    )
    error = protocol.first.child_error("kid", failed)
    assert isinstance(error, WorkflowFailedError)
    assert error.workflow_id == "kid" and error.error_type.endswith("KeyError")
    assert error.error_message == "'sku'" and "KeyError" in error.traceback


def test_a_child_cancelled_by_its_timeout_raises_a_timeout() -> None:
    status = protocol.first.WorkflowStatus.CANCELLED
    timed_out = protocol.first._failure(status, encode_error(WorkflowTimeoutError("kid")))
    error = protocol.first.child_error("kid", timed_out)
    assert isinstance(error, WorkflowTimeoutError) and error.workflow_id == "kid"
    cancelled = protocol.first.child_error("kid", protocol.first._failure(status, None))
    assert type(cancelled) is WorkflowCancelledError and cancelled.workflow_id == "kid"


def test_a_failure_without_the_childs_error_says_its_status() -> None:
    text = json.dumps({"child_status": "ERROR", "child_error": None})
    error = protocol.first.child_error("kid", text)
    assert isinstance(error, WorkflowFailedError) and error.workflow_id == "kid"
    assert error.error_type == "ERROR" and error.error_message == "ended as ERROR"


# -- parking ---------------------------------------------------------------------------------


def test_a_wait_on_a_child_alone_looks_again_after_the_recheck() -> None:
    script = Script(statements={"get_workflow_status": status_row("RUNNING")})
    run = make_run()
    with pytest.raises(WorkflowSuspended) as caught:
        script.run(protocol.wait_first(run, [OnChild("kid", "k")]))
    assert caught.value.args == (WORKFLOW_ID,) and run.parked
    parked = script.only("suspend_for_any")
    assert parked == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "wake_at": T0 + dt.timedelta(seconds=protocol.first.CHILD_RECHECK),
        "topics": [],
        "gates": [],
    }
    # No topic or gate to look at again: only the child.
    assert "Execute wake_if_any" not in script.labels


def test_an_earlier_timer_than_the_recheck_is_the_wake_up() -> None:
    script = Script(statements={"get_workflow_status": status_row("RUNNING")})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnChild("kid", "k"), OnTimer(10)]))
    assert script.only("suspend_for_any")["wake_at"] == T0 + dt.timedelta(seconds=10)


def test_a_child_that_ended_while_parking_wakes_the_workflow() -> None:
    done_row = status_row("SUCCESS", 1)
    script = Script(statements={"get_workflow_status": Then(status_row("RUNNING"), done_row)})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnChild("kid", "k")]))
    assert script.labels[-2:] == ["Execute get_workflow_status", "Execute wake_workflow"]
    assert script.only("wake_workflow") == {"workflow_id": WORKFLOW_ID}


def test_a_message_wait_alone_looks_again_at_its_topic_after_parking() -> None:
    script = Script()
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnMessage("chat")]))
    assert script.only("wake_if_any") == {
        "workflow_id": WORKFLOW_ID,
        "topics": ["chat"],
        "gates": [],
    }
    assert script.only("suspend_for_any")["wake_at"] is None


def test_a_gate_wait_alone_looks_again_at_its_gate_after_parking() -> None:
    waiting = approval_row("waiting")
    script = Script(statements={"get_approval": Then(waiting, waiting)})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.wait_first(make_run(), [OnApproval("refund")]))
    assert script.only("wake_if_any")["gates"] == ["refund"]
    assert script.only("wake_if_any")["topics"] == []


def test_a_run_parked_by_a_sibling_joins_with_its_wake_up_and_looks_again() -> None:
    def answer(op: Any) -> Any:
        return True if isinstance(op, protocol.Park) else DEFAULT

    script = Script(answer, statements={"get_workflow_status": status_row("RUNNING")})
    run = make_run()
    with pytest.raises(WorkflowSuspended) as caught:
        script.run(protocol.wait_first(run, [OnMessage("chat"), OnChild("kid", "k")]))
    assert caught.value.args == (WORKFLOW_ID,)
    assert script.only("join_suspension") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "wake_at": T0 + dt.timedelta(seconds=protocol.first.CHILD_RECHECK),
    }
    assert script.only("wake_if_any")["topics"] == ["chat"]
    assert script.labels[-1] == "Execute get_workflow_status"
    assert script.executed("suspend_for_any") == []


def test_a_park_refused_twice_with_nothing_ready_is_a_lost_fence() -> None:
    script = Script(statements={"suspend_for_any": 0})
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.wait_first(make_run(), [OnMessage("chat")]))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)
    assert len(script.executed("consume_message")) == 2  # looked again once


def test_a_message_arriving_as_the_park_is_refused_wins() -> None:
    script = Script(
        statements={
            "suspend_for_any": 0,
            "consume_message": Then(None, {"output": SERIALIZER.dumps("late")}),
        }
    )
    assert script.run(protocol.wait_first(make_run(), [OnMessage("chat")])) == (0, "late")


# -- waking the parent -----------------------------------------------------------------------


def test_a_child_wakes_its_parked_parent_and_tells_the_workers() -> None:
    run = make_run(parent_id="mom")
    script = Script(statements={"wake_workflow": 1})
    script.run(protocol.first.wake_parent(run))
    assert script.only("wake_workflow") == {"workflow_id": "mom"}
    assert script.only("notify_work") == {
        "channel": run.settings.work_channel,
        "payload": "mom",
    }


def test_a_parent_not_parked_is_not_announced() -> None:
    script = Script(statements={"wake_workflow": 0})
    script.run(protocol.first.wake_parent(make_run(parent_id="mom")))
    assert script.labels == ["Execute wake_workflow"]
    assert Script().run(protocol.first.wake_parent(make_run())) is None
