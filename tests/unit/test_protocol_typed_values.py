"""A value of a declared return type is handed out rebuilt as that type, on the first run
and on a replay alike, by every kind of call; and the last decisions the other tests leave
open (a second refusal by the cap, a tool's scope, what a send journals, the default of a
gate, a close's label, an outcome refused in exit mode)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import EffectStatus, StepKind, WorkflowStatus
from durable._core import AppEnd, Call, Outcome, RunChild, lifecycle
from durable._core.journal import rebuild_error
from durable._run.host_sync import drive
from durable.errors import (
    DatabaseUnavailableError,
    StaleOwnerError,
    StepError,
    WorkflowInterrupted,
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
    Raise,
    Script,
    Then,
    approval_row,
    done,
    effect_def,
    effect_row,
    held,
    ledger,
    make_run,
    over_the_cap,
    step_def,
    workflow_def,
)
from tests.unit.test_lifecycle import Script as LifeScript


@dataclasses.dataclass
class Point:
    x: int


def locate() -> Point:
    return Point(1)


def locate_in(conn: Any) -> Point:
    return Point(1)


def charge(cents: int, *, idempotency_key: str) -> Point:
    return Point(cents)


STORED = SERIALIZER.dumps({"x": 1})


# -- typed values ----------------------------------------------------------------------------


def test_a_step_hands_out_its_declared_type_first_and_on_replay() -> None:
    assert Script().run(protocol.step(make_run(), step_def(locate), (), {})) == Point(1)
    run = make_run(records=[done(0, "locate", {"x": 1})])
    assert Script().run(protocol.step(run, step_def(locate), (), {})) == Point(1)


def test_a_transaction_hands_out_its_declared_type_first_adopted_and_on_replay() -> None:
    defn = step_def(locate_in, "locate", kind=StepKind.TRANSACTION)
    assert Script().run(protocol.transaction(make_run(), defn, (), {})) == Point(1)
    run = make_run(records=[done(0, "locate", {"x": 1}, StepKind.TRANSACTION)])
    assert Script().run(protocol.transaction(run, defn, (), {})) == Point(1)
    run = make_run(app_separate=True, first_run=False)
    row = {"step_name": "locate", "output": STORED}
    adopted = Script(statements={"app_get_transaction": row})
    assert adopted.run(protocol.transaction(run, defn, (), {})) == Point(1)


def test_a_child_hands_out_its_declared_type_first_and_on_replay() -> None:
    defn = workflow_def(locate)
    script = Script(lambda op: Outcome(Point(1)) if isinstance(op, RunChild) else DEFAULT)
    assert script.run(protocol.child(make_run(), defn, (), {})) == Point(1)
    run = make_run(records=[done(0, "locate", {"x": 1}, StepKind.CHILD)])
    assert Script().run(protocol.child(run, defn, (), {})) == Point(1)


def test_an_effect_hands_out_its_declared_type_however_it_was_settled() -> None:
    defn = effect_def(charge, reconcile=lambda key, cents: {"x": cents})
    assert Script().run(protocol.effect(make_run(), defn, (1,), {})) == Point(1)
    run = make_run(records=[done(0, "charge", {"x": 1}, StepKind.EFFECT)])
    assert Script().run(protocol.effect(run, defn, (1,), {})) == Point(1)
    text = SERIALIZER.dumps({"args": [1], "kwargs": {}})
    fingerprint = protocol.effects.hashlib.sha256(text.encode("utf-8")).hexdigest()
    applied = effect_row(EffectStatus.APPLIED, fingerprint, result={"x": 1}, name="charge")
    script = Script(statements={"get_effect": applied})
    assert script.run(protocol.effect(make_run(first_run=False), defn, (1,), {})) == Point(1)
    pending = effect_row(EffectStatus.PENDING, fingerprint, name="charge")
    script = Script(statements={"get_effect": pending})
    assert script.run(protocol.effect(make_run(first_run=False), defn, (1,), {})) == Point(1)


def test_a_workflow_and_a_waited_child_hand_out_their_declared_type() -> None:
    run = make_run()
    assert Script().run(protocol.workflow(run, workflow_def(locate), (), {})) == Point(1)
    status = {"status": "SUCCESS", "output": STORED, "error": None, "serializer": "json"}
    child = protocol.OnChild("kid", "locate", locate)
    script = Script(statements={"get_workflow_status": status})
    assert script.run(protocol.wait_first(make_run(), [child])) == (0, Point(1))


# -- steps -----------------------------------------------------------------------------------


def test_a_second_refusal_by_the_cap_asks_at_a_gate_of_its_own() -> None:
    calls: list[int] = []
    run, script = over_the_cap(approvals=1, calls=calls)
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.step(run, step_def(locate, "llm"), (), {}))
    looked = [params["name"] for params in script.executed("get_approval")]
    assert looked == ["budget@0:cap0", "budget@0:cap1"]
    assert script.only("approval_request")["name"] == "budget@0:cap1"
    assert len(calls) == 2


def test_a_tools_attempt_runs_in_a_tool_scope() -> None:
    defn = step_def(locate, kind=StepKind.TOOL)
    script = Script(statements={"record_charged_step": {"written": 1, "budget_id": None}})
    script.run(protocol.step(make_run(), defn, (), {}))
    assert script.of_type(Call)[0].scope.kind == "tool"


def test_a_failed_question_about_the_app_database_is_rolled_back_as_an_outage() -> None:
    refused = RuntimeError("read-only")
    run = make_run(
        classify_app_error=lambda exc: (
            protocol.AppFault(protocol.Fault.READ_ONLY) if exc is refused else None
        )
    )

    def answer(op: Any) -> Any:
        if isinstance(op, protocol.AppExecute) and op.name == "app_refuses_writes":
            raise ConnectionError("gone")
        return DEFAULT

    script = Script(answer, statements={"record_step_in_app": Raise(refused)})
    with pytest.raises(DatabaseUnavailableError):
        script.run(
            protocol.transaction(run, step_def(locate_in, kind=StepKind.TRANSACTION), (), {})
        )
    assert script.ops[-1] == AppEnd(commit=False)


def test_a_charged_record_given_up_raises_the_outage_that_cut_it() -> None:
    cut = DatabaseUnavailableError("cut")
    run = make_run(proven_at=100.0, budget_id=WORKFLOW_ID, ledger=ledger(limit_steps=10))
    lapsed = 100.0 + run.settings.lease_seconds

    def answer(op: Any) -> Any:
        return (lapsed, 50.0) if isinstance(op, protocol.LeaseClock) else DEFAULT

    script = Script(answer, statements={"record_charged_step": Raise(cut)})
    with pytest.raises(DatabaseUnavailableError) as caught:
        script.run(protocol.step(run, step_def(locate), (), {}))
    assert caught.value is cut


# -- messages and gates ----------------------------------------------------------------------


def test_a_send_to_no_workflow_journals_the_error_at_its_position() -> None:
    run = make_run(records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    script = Script()
    with pytest.raises(WorkflowNotFoundError):
        script.run(protocol.send(run, "nobody", "hi", "chat", None))
    record = script.only("record_step")
    assert (record["step_seq"], record["step_name"], record["kind"]) == (1, "send:chat", "send")
    assert "WorkflowNotFoundError" in record["error"] and record["output"] is None


def test_a_send_journals_the_message_id_at_its_position_after_its_crash_point() -> None:
    points: list[str] = []
    run = make_run(records=[done(0, "fetch", 1)], crash_point=points.append)
    run.journal.next_call("fetch")
    script = Script(
        statements={
            "get_workflow_status": {"status": "RUNNING"},
            "get_incarnation": {"incarnation": ""},
        }
    )
    script.run(protocol.send(run, "other", "hi", "chat", "k1"))
    record = script.only("record_step")
    assert (record["step_seq"], SERIALIZER.loads(record["output"])) == (1, "k1")
    assert points == ["after_send_message"]


def test_an_event_read_is_journaled_at_its_position() -> None:
    run = make_run(records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    script = Script(statements={"get_event": {"value": "1"}})
    script.run(protocol.get_event(run, "other", "k", 1.0))
    assert script.only("record_step")["step_seq"] == 1


def test_gates_are_asked_without_an_automatic_approval_unless_told() -> None:
    script = Script(statements={"get_approval": None})
    with pytest.raises(WorkflowSuspended) as caught:
        script.run(protocol.approval(make_run(), "refund"))
    assert caught.value.args == (WORKFLOW_ID,)
    assert script.only("approval_request")["default_approved"] is False
    script = Script(statements={"get_approval": None})
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.gate(make_run(), "g", 0, "null"))
    assert script.only("approval_request")["default_approved"] is False


def test_a_gate_whose_park_is_refused_and_still_waiting_names_the_run_that_lost() -> None:
    waiting = approval_row("waiting")
    script = Script(statements={"get_approval": waiting, "suspend_for_approval": 0})
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.gate(make_run(), "g", 0, "null"))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_a_gate_parked_by_a_sibling_names_its_workflow() -> None:
    def answer(op: Any) -> Any:
        return True if isinstance(op, protocol.Park) else DEFAULT

    script = Script(answer, statements={"get_approval": approval_row("waiting")})
    with pytest.raises(WorkflowSuspended) as caught:
        script.run(protocol.gate(make_run(), "g", 0, "null"))
    assert caught.value.args == (WORKFLOW_ID,)


def test_a_wait_parked_by_a_sibling_looks_again_at_its_gates_and_default_topic() -> None:
    def answer(op: Any) -> Any:
        return True if isinstance(op, protocol.Park) else DEFAULT

    waiting = approval_row("waiting")
    script = Script(answer, statements={"get_approval": Then(waiting, waiting)})
    with pytest.raises(WorkflowSuspended):
        conditions = [protocol.OnApproval("refund"), protocol.OnMessage()]
        script.run(protocol.wait_first(make_run(), conditions))
    assert script.only("wake_if_any") == {
        "workflow_id": WORKFLOW_ID,
        "topics": [""],
        "gates": ["refund"],
    }


def test_a_won_wait_passes_its_crash_point() -> None:
    points: list[str] = []
    script = Script(statements={"consume_message": {"output": "1"}})
    script.run(protocol.wait_first(make_run(crash_point=points.append), [protocol.OnMessage()]))
    assert points == ["after_wait_first"]


# -- streams ---------------------------------------------------------------------------------


def test_a_close_is_journaled_under_the_close_label_and_replays_as_none() -> None:
    script = Script()
    script.run(protocol.write_stream(make_run(), "s", None, closing=True))
    assert script.only("write_stream")["step_name"] == protocol.streams.labels.stream("s", True)
    closed = done(0, protocol.streams.labels.stream("s", True), None, StepKind.STREAM)
    assert Script().run(protocol.write_stream(make_run(records=[closed]), "s", None, True)) is None


def test_state_and_turns_are_journaled_at_their_position_with_their_text() -> None:
    run = make_run(records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    script = Script()
    script.run(protocol.set_state(run, {"n": 1}))
    script.run(protocol.append_turn(run, "user", "hi"))
    state, turn = script.executed("record_step")
    assert (state["step_seq"], SERIALIZER.loads(state["output"])) == (1, {"n": 1})
    assert turn["step_seq"] == 2
    assert SERIALIZER.loads(turn["output"]) == {"role": "user", "content": "hi"}


# -- the finish ------------------------------------------------------------------------------


def test_a_success_refused_in_exit_mode_keeps_its_held_records_for_the_cancel() -> None:
    run = make_run(mode="exit")
    run.pending.append(held(0, "earlier"))

    def refused(op: Any) -> Any:
        return [] if isinstance(op, protocol.WriteSteps) else DEFAULT

    script = Script(refused, statements={"finish_refused": {"cancel_reason": "operator"}})
    with pytest.raises(WorkflowInterrupted) as caught:
        script.run(protocol.finish(run, WorkflowStatus.SUCCESS, '"done"', None))
    assert caught.value.reason == "operator" and caught.value.timed_out is False
    assert [row["step_name"] for row in run.pending] == ["earlier"]


def test_each_outcome_written_is_observed_with_the_workflows_name() -> None:
    seen: list[tuple[str, str]] = []
    run = make_run()
    run.settings = dataclasses.replace(run.settings, observe_finish=lambda *a: seen.append(a))
    Script().run(protocol.finish(run, WorkflowStatus.ERROR, None, "{}"))
    assert seen == [("order", "ERROR")]


def test_a_timed_out_run_with_undos_finishes_cancelled_with_its_timeout() -> None:
    run = make_run(deadline=T0)
    protocol.register_compensation(run, lambda: None, (), {})

    def body() -> None:
        protocol.check_interrupt(run)

    script = Script()
    with pytest.raises(WorkflowTimeoutError) as caught:
        script.run(protocol.workflow(run, workflow_def(body, timeout=30.0), (), {}))
    assert caught.value.workflow_id == WORKFLOW_ID
    finish = script.executed("finish_workflow")[-1]
    assert finish["status"] == "CANCELLED"
    stored = json.loads(finish["error"])
    assert stored["type"] == "durable.errors.WorkflowTimeoutError" and stored["compensated"]


def test_an_undo_without_a_step_is_named_by_its_repr_when_it_fails() -> None:
    def plain_undo() -> None:
        raise ValueError("no")

    run = make_run()
    protocol.register_compensation(run, plain_undo, (), {})

    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.fn.__name__ == "locate":
            return Outcome(error=RuntimeError("x"))
        return DEFAULT

    script = Script(answer)
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(locate), (), {}))
    detail = json.loads(script.only("finish_workflow")["error"])
    assert detail["failed_compensation"] == repr(plain_undo)


# -- the rest --------------------------------------------------------------------------------


def test_an_unknown_builtin_name_is_a_step_error() -> None:
    text = '{"type": "builtins.NoSuchError", "message": "m", "traceback": ""}'
    assert isinstance(rebuild_error("fetch", text), StepError)


def test_a_partitions_key_must_end_in_digits_only() -> None:
    fault = protocol.AppFault(protocol.Fault.UNIQUE, "steps_pkey_x1")
    run = make_run(classify_app_error=lambda exc: fault)
    assert protocol.journal._already_written(run, RuntimeError()) is False


def test_a_local_run_given_no_time_says_so() -> None:
    script = LifeScript((lifecycle.WaitLocal, None))
    with pytest.raises(lifecycle.ResultTimeoutError) as caught:
        drive(lifecycle.result("w", 0.0, True), script)
    assert caught.value.timeout == 0.0


def test_a_read_past_its_timeout_says_how_long_it_waited() -> None:
    def slept(op: Any) -> None:
        script.clock += op.seconds

    steps: list[tuple[type, Any]] = []
    for _ in range(20):
        steps += [(lifecycle.Finished, (False, None)), (lifecycle.Sleep, slept)]
    script = LifeScript(*steps)
    with pytest.raises(lifecycle.ResultTimeoutError) as caught:
        drive(lifecycle.result("w", 0.1, False), script)
    assert caught.value.timeout == 0.1


def test_transitions_from_an_unknown_state_are_not_allowed() -> None:
    table = protocol.EFFECT_TRANSITIONS
    assert protocol.transitions.allowed(table, "nowhere", EffectStatus.APPLIED) is False
