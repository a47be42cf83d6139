"""A run's body and its finish (compensations, cancellation), transactions and children."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import Budget, StepKind, StepRecord, WorkflowStatus
from durable._base.registry import StepDef
from durable._core import (
    TRANSACTION_OUTPUTS_TAKEN,
    AppBegin,
    AppCall,
    Call,
    Outcome,
    RunChild,
    decode_error,
)
from durable.errors import (
    BranchOrderError,
    DatabaseUnavailableError,
    NondeterminismError,
    QueueDedupError,
    SerializationError,
    StaleOwnerError,
    TransactionStepError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowHandedOver,
    WorkflowInterrupted,
    WorkflowSuspended,
    WorkflowTimeoutError,
)
from tests.unit.scripted import (
    APP_CONN,
    DEFAULT,
    EPOCH,
    FENCE,
    LOST,
    READ_ONLY,
    T0,
    WORKFLOW_ID,
    Raise,
    Script,
    Then,
    body,
    done,
    failed,
    held,
    ledger,
    ledger_row,
    make_run,
    step_def,
    workflow_def,
)


def undo(name: str, error: Exception | None = None) -> Any:
    """An undo action, named like a registered effect (compensate reads `__durable_step__`)."""

    def compensation(*args: Any, **kwargs: Any) -> None:
        if error is not None:
            raise error

    compensation.__name__ = name
    compensation.__durable_step__ = StepDef(name, compensation)  # type: ignore[attr-defined]
    return compensation


def body_that(run: Any, *, registers: list[Any] = (), outcome: Outcome) -> Any:  # type: ignore[assignment]
    """An answer for the body's Call: it registers undos (as its effects would), then ends
    with `outcome`; every other operation gets the default answer."""

    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.fn is body:
            for i, action in enumerate(registers):
                protocol.register_compensation(run, action, (i,), {"why": "test"})
            return outcome
        return DEFAULT

    return answer


def finish_params(script: Script) -> dict[str, Any]:
    return script.only("finish_workflow")


# -- the body and its finish ----------------------------------------------------------------


def test_success_finishes_with_the_output() -> None:
    script = Script()
    assert script.run(protocol.workflow(make_run(), workflow_def(body), (), {})) == "done"
    assert script.labels == ["Call body", "Join", "Execute finish_workflow"]
    assert finish_params(script) == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "status": "SUCCESS",
        "output": '"done"',
        "error": None,
    }


def test_the_ledger_is_opened_before_the_body() -> None:
    run = make_run(budget_id=WORKFLOW_ID)
    script = Script(statements={"ensure_budget": ledger_row(limit_steps=10)})
    script.run(protocol.workflow(run, workflow_def(body, budget=Budget(steps=10)), (), {}))
    assert script.labels == [
        "Execute ensure_budget",
        "Call body",
        "Join",
        "Execute finish_workflow",
    ]
    assert run.ledger is not None and run.ledger.limit_steps == 10


def test_an_error_finishes_as_error_and_is_reraised() -> None:
    error = ValueError("bad input")
    run = make_run()
    script = Script(body_that(run, outcome=Outcome(error=error)))
    with pytest.raises(ValueError) as info:
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert info.value is error
    finish = finish_params(script)
    assert (finish["status"], finish["output"]) == ("ERROR", None)
    assert decode_error(finish["error"])[:2] == ("builtins.ValueError", "bad input")


def test_an_unserializable_result_finishes_as_error() -> None:
    run = make_run()
    script = Script(body_that(run, outcome=Outcome(object())))
    with pytest.raises(SerializationError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    finish = finish_params(script)
    assert finish["status"] == "ERROR"
    assert decode_error(finish["error"])[0] == "durable.errors.SerializationError"


def test_a_refused_finish_is_a_stale_owner() -> None:
    with pytest.raises(StaleOwnerError):
        Script(statements={"finish_workflow": 0}).run(
            protocol.workflow(make_run(), workflow_def(body), (), {})
        )


def test_an_error_with_compensations_undoes_in_reverse_then_finishes_compensated() -> None:
    first, second = undo("unbook_hotel"), undo("unbook_flight")
    run = make_run()
    error = RuntimeError("payment failed")
    script = Script(body_that(run, registers=[first, second], outcome=Outcome(error=error)))
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == [
        "Call body",
        "Join",
        "Call unbook_flight",
        "Call unbook_hotel",
        "Execute finish_workflow",
    ]
    calls = script.of_type(Call)
    assert (calls[1].args, calls[1].kwargs) == ((1,), {"why": "test"})
    finish = finish_params(script)
    assert finish["status"] == "COMPENSATED"
    assert decode_error(finish["error"])[1] == "payment failed"
    assert run.compensations == []


def test_a_failing_compensation_stops_the_saga_as_compensation_failed() -> None:
    first = undo("unbook_hotel")
    second = undo("unbook_flight", ConnectionError("airline down"))
    run = make_run()
    error = RuntimeError("payment failed")
    script = Script(body_that(run, registers=[first, second], outcome=Outcome(error=error)))
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == ["Call body", "Join", "Call unbook_flight", "Execute finish_workflow"]
    finish = finish_params(script)
    assert finish["status"] == "COMPENSATION_FAILED"
    detail = json.loads(finish["error"])
    assert detail["failed_compensation"] == "unbook_flight"
    assert detail["message"] == "compensation 'unbook_flight' failed: airline down"
    assert detail["type"] == "builtins.ConnectionError"
    assert detail["original_error"]["message"] == "payment failed"


def test_a_stale_owner_from_a_compensation_leaves_the_status_alone() -> None:
    stale = undo("unbook", StaleOwnerError(WORKFLOW_ID, EPOCH))
    run = make_run()
    script = Script(body_that(run, registers=[stale], outcome=Outcome(error=ValueError("x"))))
    with pytest.raises(StaleOwnerError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.executed("finish_workflow") == []


def test_each_undo_is_claimed_on_its_ledger_row_and_skipped_when_another_has_it() -> None:
    """A fork shares the effects it copied with its original: the undo of each is claimed
    on the row that records it, and one claimed by another workflow (or a position where
    no effect was applied) is not sent again."""
    hotel, flight, car = undo("unbook_hotel"), undo("unbook_flight"), undo("unbook_car")
    run = make_run()
    for seq, action in enumerate([hotel, flight, car]):
        protocol.register_compensation(run, action, (seq,), {}, "original", seq)
    claims = Then(
        {"owned": 1, "undone_by": WORKFLOW_ID},  # the car: this run claimed it
        {"owned": 1, "undone_by": "original"},  # the flight: the original undid it
        # the hotel: nothing applied at that position (the original's ledger is there)
        {"owned": 1, "undone_by": None, "ledger": True},
    )
    script = Script(
        body_that(run, outcome=Outcome(error=RuntimeError("no visa"))),
        statements={"claim_undo": claims},
    )
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == [
        "Call body",
        "Join",
        "Execute claim_undo",
        "Call unbook_car",
        "Execute claim_undo",
        "Execute claim_undo",
        "Execute finish_workflow",
    ]
    assert script.executed("claim_undo") == [
        {"workflow_id": WORKFLOW_ID, "epoch": EPOCH, "applied_in": "original", "step_seq": s}
        for s in (2, 1, 0)
    ]
    assert finish_params(script)["status"] == "COMPENSATED"


def test_a_shared_effect_whose_ledger_is_gone_fails_the_compensation_loudly() -> None:
    """The original's ledger was pruned (or not imported with the fork): whether the
    effect was undone cannot be told. Not undone blindly, nor skipped in silence as if it
    were: the run ends COMPENSATION_FAILED naming it, after the undos it could claim."""
    hotel, car = undo("unbook_hotel"), undo("unbook_car")
    run = make_run()
    protocol.register_compensation(run, hotel, (0,), {}, "original", 0)
    protocol.register_compensation(run, car, (1,), {}, WORKFLOW_ID, 1)  # the fork's own
    claims = Then(
        {"owned": 1, "undone_by": WORKFLOW_ID, "ledger": True},
        {"owned": 1, "undone_by": None, "ledger": False},
    )
    script = Script(
        body_that(run, outcome=Outcome(error=RuntimeError("no visa"))),
        statements={"claim_undo": claims},
    )
    with pytest.raises(RuntimeError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert "Call unbook_hotel" not in script.labels
    assert "Call unbook_car" in script.labels
    finish = finish_params(script)
    assert finish["status"] == "COMPENSATION_FAILED"
    detail = json.loads(finish["error"])
    assert detail["type"] == "durable.errors.SharedEffectLostError"
    assert detail["failed_compensation"] == "unbook_hotel"


def test_a_claim_refused_by_the_fence_is_a_stale_owner() -> None:
    run = make_run()
    protocol.register_compensation(run, undo("refund"), (1,), {}, WORKFLOW_ID, 0)
    script = Script(
        body_that(run, outcome=Outcome(error=RuntimeError("x"))),
        statements={"claim_undo": {"owned": 0, "undone_by": None}},
    )
    with pytest.raises(StaleOwnerError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == ["Call body", "Join", "Execute claim_undo"]


@pytest.mark.parametrize(
    "error",
    [StaleOwnerError(WORKFLOW_ID, EPOCH), DatabaseUnavailableError("gone")],
    ids=["stale", "database-unavailable"],
)
def test_lost_ownership_or_database_leaves_the_status_alone(error: Exception) -> None:
    run = make_run()
    script = Script(body_that(run, registers=[undo("refund")], outcome=Outcome(error=error)))
    with pytest.raises(type(error)):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == ["Call body", "Join"]


def test_a_suspension_leaves_the_status_alone() -> None:
    script = Script(lambda op: Raise(WorkflowSuspended(WORKFLOW_ID)))
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.workflow(make_run(), workflow_def(body), (), {}))
    # Nothing written; the run waits for its other branches (those parking join it).
    assert script.labels == ["Call body", "Join"]


# -- a stopping worker: each run is handed over at its next step boundary --------------------


def test_a_stopping_worker_hands_the_run_over_after_the_step_under_way() -> None:
    """The worker stops while a step runs: that step is recorded, the next one never
    starts, and the workflow is released (fenced by the epoch) with idle workers woken.
    Nothing is finished or cancelled: another worker replays the step and goes on."""
    stopping = False
    run = make_run(handing_over=lambda: stopping)

    def first() -> str:
        nonlocal stopping
        stopping = True  # SIGTERM while the step runs
        return "one"

    def second() -> str:
        raise AssertionError("a step after the worker stopped ran")

    def two_steps() -> str:
        return str(script.run(protocol.step(run, step_def(first), (), {}))) + str(
            script.run(protocol.step(run, step_def(second), (), {}))
        )

    script = Script()
    with pytest.raises(WorkflowHandedOver):
        script.run(protocol.workflow(run, workflow_def(two_steps), (), {}))
    assert script.labels == [
        "Call two_steps",
        "Call first",
        "Execute record_step",
        "Join",
        "Execute release_workflow",
        "Execute notify_work",
    ]
    assert script.only("record_step")["step_name"] == "first"
    assert script.only("release_workflow") == {"workflow_id": WORKFLOW_ID, "epoch": EPOCH}


def test_a_handed_over_run_writes_what_it_holds_before_it_lets_go() -> None:
    """In exit (and async) durability the records a run holds are written before its
    claim is released: the next worker must replay them, not run their steps again."""
    run = make_run(mode="exit")
    run.pending.append(held(0, "earlier"))

    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.fn is body:
            return Raise(WorkflowHandedOver(WORKFLOW_ID))  # its next step saw the stop
        return DEFAULT

    script = Script(answer)
    with pytest.raises(WorkflowHandedOver):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == [
        "Call body",
        "Join",
        "WriteSteps 1",
        "Execute release_workflow",
        "Execute notify_work",
    ]
    assert run.pending == []


def test_a_run_whose_claim_is_gone_wakes_nobody() -> None:
    """Released already (the grace ended) or taken: the release touches no row."""
    run = make_run(handing_over=lambda: True)
    script = Script(statements={"release_workflow": 0})
    with pytest.raises(WorkflowHandedOver):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == ["Join", "Execute release_workflow"]


def test_a_claim_queued_on_a_stopping_worker_never_starts() -> None:
    run = make_run(handing_over=lambda: True, budget_id=WORKFLOW_ID)
    script = Script()
    with pytest.raises(WorkflowHandedOver):
        script.run(protocol.workflow(run, workflow_def(body, budget=Budget(steps=1)), (), {}))
    assert "Call body" not in script.labels
    assert "Execute ensure_budget" not in script.labels
    assert script.labels[-2:] == ["Execute release_workflow", "Execute notify_work"]


def test_a_cancel_is_acted_on_before_a_hand_over_and_its_undo_is_not_cut_short() -> None:
    run = make_run(cancel="user asked", handing_over=lambda: True)
    with pytest.raises(WorkflowInterrupted) as info:
        protocol.check_interrupt(run)
    assert type(info.value) is WorkflowInterrupted
    run.stopping = True  # its compensations run: neither stops them
    protocol.check_interrupt(run)


# -- stopping: cancel and timeout -----------------------------------------------------------


def interrupted(reason: str, timed_out: bool = False) -> Any:
    def answer(op: Any) -> Any:
        if isinstance(op, Call) and op.fn is body:
            raise WorkflowInterrupted(WORKFLOW_ID, reason, timed_out)
        return DEFAULT

    return answer


def test_an_interrupt_cancels_the_tree_then_finishes_cancelled() -> None:
    run = make_run()
    script = Script(interrupted("user asked"))
    with pytest.raises(WorkflowCancelledError) as info:
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert type(info.value) is WorkflowCancelledError
    assert info.value.reason == "user asked"
    assert script.labels == [
        "Call body",
        "Join",
        "Execute children_of",
        "Execute cancel_workflows",
        "Execute finish_workflow",
    ]
    assert script.ops[3].fetch == "all"
    cancel = script.only("cancel_workflows")
    assert (cancel["workflow_ids"], cancel["reason"]) == ([WORKFLOW_ID], "user asked")
    finish = finish_params(script)
    assert finish["status"] == "CANCELLED"
    assert finish["error"] == cancel["error"]
    assert decode_error(finish["error"])[0] == "durable.errors.WorkflowCancelledError"
    assert run.stopping


def test_a_cancel_walks_the_tree_a_level_at_a_time_and_asks_again_for_what_changed() -> None:
    """The descendants are found level by level (no recursive query: a schema sharded by
    workflow id cannot run one over parent_id); a workflow whose row changed between the
    cancel's read and its write (not settled) is asked again, alone."""

    def row(workflow_id: str, settled: bool) -> dict[str, Any]:
        return {"workflow_id": workflow_id, "status": "PENDING", "epoch": 1, "settled": settled}

    script = Script(
        statements={
            "children_of": Then(
                [{"workflow_id": "c1"}, {"workflow_id": "c2"}],
                [{"workflow_id": "g1"}, {"workflow_id": WORKFLOW_ID}],  # a cycle is cut
                [],
            ),
            "cancel_workflows": Then(
                [row(WORKFLOW_ID, True), row("c1", True), row("c2", False), row("g1", True)],
                [row("c2", True)],
            ),
        }
    )
    done = script.run(protocol.cancel_tree(WORKFLOW_ID, "stop", "{}"))
    assert [p["workflow_ids"] for p in script.executed("children_of")] == [
        [WORKFLOW_ID],
        ["c1", "c2"],
        ["g1"],
    ]
    assert [p["workflow_ids"] for p in script.executed("cancel_workflows")] == [
        [WORKFLOW_ID, "c1", "c2", "g1"],
        ["c2"],
    ]
    assert sorted(r["workflow_id"] for r in done) == sorted([WORKFLOW_ID, "c1", "c2", "g1"])


def test_a_cancel_asked_after_the_last_call_wins_over_success() -> None:
    # The body returned; the SUCCESS outcome is refused because a cancel request stands
    # (the statement checks it): the run stops as cancelled, as at any call before.
    run = make_run()
    script = Script(
        statements={
            "finish_workflow": Then(0, 1),
            "finish_refused": {"cancel_reason": "operator"},
        }
    )
    with pytest.raises(WorkflowCancelledError) as info:
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert info.value.reason == "operator"
    assert script.labels == [
        "Call body",
        "Join",
        "Execute finish_workflow",
        "Execute finish_refused",
        "Execute children_of",
        "Execute cancel_workflows",
        "Execute finish_workflow",
    ]
    success, cancelled = script.executed("finish_workflow")
    assert (success["status"], cancelled["status"]) == ("SUCCESS", "CANCELLED")
    assert run.output is None


def test_a_success_refused_with_no_cancel_standing_is_lost_ownership() -> None:
    script = Script(statements={"finish_workflow": 0, "finish_refused": None})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.workflow(make_run(), workflow_def(body), (), {}))
    assert script.executed("cancel_workflows") == []


def test_a_refused_failure_is_lost_ownership_without_asking_why() -> None:
    # ERROR, CANCELLED, COMPENSATED: a cancel request does not change a failure's outcome.
    script = Script(statements={"finish_workflow": 0})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.finish(make_run(), WorkflowStatus.ERROR, None, "{}"))
    assert script.executed("finish_refused") == []


def test_a_timeout_finishes_cancelled_with_a_timeout_error() -> None:
    script = Script(interrupted("timeout", timed_out=True))
    with pytest.raises(WorkflowTimeoutError) as info:
        script.run(protocol.workflow(make_run(), workflow_def(body, timeout=30), (), {}))
    assert info.value.timeout == 30
    assert decode_error(finish_params(script)["error"])[0] == "durable.errors.WorkflowTimeoutError"


def test_an_interrupt_runs_the_compensations_then_finishes_cancelled() -> None:
    run = make_run()
    protocol.register_compensation(run, undo("refund"), (5,), {})
    script = Script(interrupted("user asked"))
    with pytest.raises(WorkflowCancelledError):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.labels == [
        "Call body",
        "Join",
        "Execute children_of",
        "Execute cancel_workflows",
        "Call refund",
        "Execute finish_workflow",
    ]
    assert finish_params(script)["status"] == "CANCELLED"
    # The stored error says the undo ran: resume refuses it (a replay would redo the
    # effect on top of its undo, and undo it again under a new key).
    assert json.loads(finish_params(script)["error"])["compensated"] is True


def test_a_cancel_with_nothing_to_undo_is_not_marked_compensated() -> None:
    script = Script(interrupted("user asked"))
    with pytest.raises(WorkflowCancelledError):
        script.run(protocol.workflow(make_run(), workflow_def(body), (), {}))
    assert "compensated" not in json.loads(finish_params(script)["error"])


def test_an_interrupt_during_error_compensation_still_finishes() -> None:
    def interrupted_undo(*args: Any, **kwargs: Any) -> None:
        # What the undo @effect does: its check_interrupt sees the passed deadline, unless
        # the run is already stopping (undoing), which must not be cut short.
        protocol.check_interrupt(run)

    run = make_run(deadline=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    script = Script(
        body_that(run, registers=[interrupted_undo], outcome=Outcome(error=ValueError("x")))
    )
    with pytest.raises((ValueError, WorkflowCancelledError)):
        script.run(protocol.workflow(run, workflow_def(body), (), {}))
    assert script.executed("finish_workflow") != []


# -- transactions ---------------------------------------------------------------------------


def move_money(conn: Any, cents: int) -> dict[str, int]:
    assert conn == APP_CONN
    return {"moved": cents}


def txn(fn: Any = move_money) -> Any:
    return step_def(fn, "move_money", kind=StepKind.TRANSACTION, isolation_level="SERIALIZABLE")


def test_same_database_transaction_records_inside_the_users_transaction() -> None:
    script = Script()
    result = script.run(protocol.transaction(make_run(), txn(), (250,), {}))
    assert result == {"moved": 250}
    assert script.labels == [
        "AppBegin",
        "AppCall move_money",
        "AppEnd commit with record_step_in_app",
    ]
    assert script.ops[0] == AppBegin("SERIALIZABLE")
    assert script.ops[1] == AppCall(
        move_money, (250,), {}, protocol.StepScope("move_money", seq=0, kind="transaction")
    )
    assert script.only("record_step_in_app") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": 0,
        "step_name": "move_money",
        "kind": "transaction",
        "output": '{"moved":250}',
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": T0,
    }


def test_same_database_fence_refusal_rolls_back() -> None:
    lost = RuntimeError("run 3 of workflow wf no longer owns it")
    run = make_run(classify_app_error=lambda exc: FENCE if exc is lost else None)
    script = Script(statements={"record_step_in_app": Raise(lost)})
    with pytest.raises(StaleOwnerError) as info:
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert info.value.__cause__ is lost
    assert script.labels[-2:] == ["AppEnd commit with record_step_in_app", "AppEnd rollback"]
    assert script.executed("record_step") == []  # the refusal is not journaled as a failure


def test_same_database_record_that_wrote_nothing_is_a_refusal() -> None:
    script = Script(statements={"record_step_in_app": 0})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.transaction(make_run(), txn(), (1,), {}))
    assert script.executed("record_step") == []


def test_a_transaction_the_steps_code_ended_fails_the_step_and_is_journaled() -> None:
    # The driver sends back None: no transaction was open for the record any more.
    script = Script(statements={"record_step_in_app": None})
    with pytest.raises(TransactionStepError, match=r"conn\.commit\(\)"):
        script.run(protocol.transaction(make_run(), txn(), (1,), {}))
    (row,) = script.executed("record_step")
    assert row["error"] is not None and "TransactionStepError" in row["error"]
    assert row["output"] is None


def test_a_transaction_left_in_error_by_the_steps_code_fails_the_step() -> None:
    # The step's code caught a database error and returned: the driver sent nothing.
    script = Script(statements={"record_step_in_app": protocol.ABORTED})
    with pytest.raises(TransactionStepError, match="caught a database error"):
        script.run(protocol.transaction(make_run(), txn(), (1,), {}))
    (row,) = script.executed("record_step")
    assert "TransactionStepError" in row["error"]


def read_only_run(refuses: Any) -> tuple[Any, Script, BaseException]:
    refused = RuntimeError("cannot execute INSERT in a read-only transaction")
    run = make_run(classify_app_error=lambda exc: READ_ONLY if exc is refused else None)
    answers: dict[str, Any] = {"record_step_in_app": Raise(refused)}
    answers["app_refuses_writes"] = refuses
    return run, Script(statements=answers), refused


def test_a_read_only_transaction_of_the_steps_own_is_its_error() -> None:
    run, script, refused = read_only_run({"refuses": False})
    with pytest.raises(TransactionStepError, match="READ ONLY") as info:
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert info.value.__cause__ is refused
    assert script.labels[-4:-1] == ["AppBegin", "AppExecute app_refuses_writes", "AppEnd rollback"]
    (row,) = script.executed("record_step")
    assert "TransactionStepError" in row["error"]


@pytest.mark.parametrize("refuses", [{"refuses": True}, Raise(RuntimeError("no server"))])
def test_a_database_that_refuses_every_write_is_an_outage(refuses: Any) -> None:
    # A standby mid-failover, or a database read-only by default: wait it out, journal
    # nothing.
    run, script, _ = read_only_run(refuses)
    with pytest.raises(DatabaseUnavailableError):
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert script.executed("record_step") == []


def test_separate_database_records_on_both_sides_in_order() -> None:
    script = Script()
    script.run(protocol.transaction(make_run(app_separate=True), txn(), (1,), {}))
    assert script.labels == [
        "AppBegin",
        "AppCall move_money",
        "AppEnd commit with app_record_transaction",
        "Execute record_step",
    ]
    assert script.only("app_record_transaction") == script.only("record_step")


def test_separate_database_adopts_the_app_side_record_on_replay() -> None:
    run = make_run(app_separate=True, records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    row = {"step_name": "move_money", "output": '{"moved":9}'}
    script = Script(statements={"app_get_transaction": row})
    assert script.run(protocol.transaction(run, txn(), (1,), {})) == {"moved": 9}
    assert script.labels == [
        "AppBegin",
        "AppExecute app_get_transaction",
        "AppEnd commit",
        "Execute record_step",
    ]
    assert script.only("app_get_transaction") == {"workflow_id": WORKFLOW_ID, "step_seq": 1}
    assert script.only("record_step")["output"] == '{"moved":9}'


def test_separate_database_with_no_app_side_record_runs_the_transaction() -> None:
    run = make_run(app_separate=True, records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    script = Script()
    script.run(protocol.transaction(run, txn(), (1,), {}))
    assert script.labels[:3] == [
        "AppBegin",
        "AppExecute app_get_transaction",
        "AppCall move_money",
    ]


def test_an_adopted_record_of_another_step_is_nondeterminism() -> None:
    run = make_run(app_separate=True, records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    script = Script(statements={"app_get_transaction": {"step_name": "other", "output": "1"}})
    with pytest.raises(NondeterminismError):
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert script.labels[-1] == "AppEnd rollback"
    assert script.executed("record_step") == []


def test_a_user_error_rolls_back_then_is_journaled() -> None:
    def overdrawn(conn: Any, cents: int) -> None:
        raise ValueError("overdrawn")

    script = Script()
    with pytest.raises(ValueError, match="overdrawn"):
        script.run(protocol.transaction(make_run(), txn(overdrawn), (1,), {}))
    assert script.labels == [
        "AppBegin",
        "AppCall overdrawn",
        "AppEnd rollback",
        "Execute record_step",
    ]
    record = script.only("record_step")
    assert record["output"] is None
    assert decode_error(record["error"])[:2] == ("builtins.ValueError", "overdrawn")


class UniqueViolation(Exception):
    pass


def test_separate_database_key_conflict_means_another_owner() -> None:
    conflict = UniqueViolation("duplicate key")
    run = make_run(
        app_separate=True,
        classify_app_error=lambda exc: TRANSACTION_OUTPUTS_TAKEN if exc is conflict else None,
    )
    script = Script(statements={"app_record_transaction": Raise(conflict)})
    with pytest.raises(StaleOwnerError) as info:
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert info.value.__cause__ is conflict
    assert script.labels[-1] == "AppEnd rollback"
    assert script.executed("record_step") == []


def test_same_database_connection_lost_is_database_unavailable() -> None:
    lost = ConnectionError("server closed the connection")
    run = make_run(classify_app_error=lambda exc: LOST if exc is lost else None)

    def dropped(conn: Any, cents: int) -> None:
        raise lost

    script = Script()
    with pytest.raises(DatabaseUnavailableError):
        script.run(protocol.transaction(run, txn(dropped), (1,), {}))
    assert script.labels[-1] == "AppEnd rollback"
    assert script.executed("record_step") == []


def test_a_connection_lost_before_the_transaction_began_interrupts_the_run() -> None:
    """The application database cannot be reached when the step checks out its connection
    (it restarts): nothing of the step ran, so the run is interrupted (an outage) and the
    step runs when it is recovered, instead of the workflow failing for good."""
    lost = ConnectionError("server closed the connection")
    run = make_run(classify_app_error=lambda exc: LOST if exc is lost else None)

    def refuse(op: Any) -> Any:
        if isinstance(op, AppBegin):
            raise lost
        return DEFAULT

    script = Script(answer=refuse)
    with pytest.raises(DatabaseUnavailableError) as info:
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert info.value.__cause__ is lost
    assert script.labels == ["AppBegin"]  # no AppCall, no AppEnd: nothing began
    assert script.executed("record_step") == []


def test_another_error_before_the_transaction_began_is_raised_as_it_is() -> None:
    odd = RuntimeError("no such isolation level")

    def refuse(op: Any) -> Any:
        if isinstance(op, AppBegin):
            raise odd
        return DEFAULT

    with pytest.raises(RuntimeError):
        Script(answer=refuse).run(protocol.transaction(make_run(), txn(), (1,), {}))


def test_a_replayed_transaction_does_not_open_one() -> None:
    run = make_run(records=[done(0, "move_money", {"moved": 1}, StepKind.TRANSACTION)])
    script = Script()
    assert script.run(protocol.transaction(run, txn(), (1,), {})) == {"moved": 1}
    assert script.ops == []


def test_separate_database_adopts_the_first_calls_app_side_record() -> None:
    # A claimed run whose journal is empty: the first call may have committed app-side
    # before the process died, so it is looked up (a brand-new run skips the lookup).
    conflict = UniqueViolation("duplicate key")
    run = make_run(
        first_run=False,
        app_separate=True,
        classify_app_error=lambda exc: TRANSACTION_OUTPUTS_TAKEN if exc is conflict else None,
    )
    row = {"step_name": "move_money", "output": '{"moved":9}'}
    script = Script(
        statements={"app_get_transaction": row, "app_record_transaction": Raise(conflict)}
    )
    assert script.run(protocol.transaction(run, txn(), (1,), {})) == {"moved": 9}


# -- children -------------------------------------------------------------------------------


def sub() -> Any:
    return None


def child_answer(outcome: Outcome) -> Any:
    return lambda op: outcome if isinstance(op, RunChild) else DEFAULT


def test_a_child_has_a_deterministic_id_and_its_output_is_journaled() -> None:
    run = make_run(records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    defn = workflow_def(sub)
    script = Script(child_answer(Outcome("child says hi")))
    assert script.run(protocol.child(run, defn, (1,), {"k": 2})) == "child says hi"
    assert script.ops[0] == RunChild(
        defn, f"{WORKFLOW_ID}:child:1", (1,), {"k": 2}, (WORKFLOW_ID, 1)
    )
    record = script.only("record_step")
    assert (record["step_seq"], record["step_name"], record["kind"]) == (1, "sub", "child")
    assert record["child_workflow_id"] == f"{WORKFLOW_ID}:child:1"
    assert record["output"] == '"child says hi"'


def test_a_child_error_is_journaled_and_reraised() -> None:
    error = KeyError("missing")
    script = Script(child_answer(Outcome(error=error)))
    with pytest.raises(KeyError) as info:
        script.run(protocol.child(make_run(), workflow_def(sub), (), {}))
    assert info.value is error
    record = script.only("record_step")
    assert record["output"] is None
    assert decode_error(record["error"])[0] == "builtins.KeyError"


def test_a_child_that_lost_ownership_is_not_journaled() -> None:
    script = Script(child_answer(Outcome(error=StaleOwnerError("x", 1))))
    with pytest.raises(StaleOwnerError):
        script.run(protocol.child(make_run(), workflow_def(sub), (), {}))
    assert script.labels == ["RunChild wf-1:child:0"]


def test_a_child_cancelled_with_its_parent_stops_the_parent_unjournaled() -> None:
    script = Script(
        child_answer(Outcome(error=WorkflowCancelledError("wf-1:child:0", "stop"))),
        statements={"get_cancel_request": {"cancel_reason": "stop"}},
    )
    run = make_run()
    with pytest.raises(WorkflowInterrupted) as info:
        script.run(protocol.child(run, workflow_def(sub), (), {}))
    assert info.value.reason == "stop"
    assert script.labels == ["RunChild wf-1:child:0", "Execute get_cancel_request"]
    assert run.cancel_reason == "stop"


def test_a_child_cancelled_alone_is_journaled_as_its_failure() -> None:
    script = Script(child_answer(Outcome(error=WorkflowCancelledError("wf-1:child:0", "stop"))))
    with pytest.raises(WorkflowCancelledError):
        script.run(protocol.child(make_run(), workflow_def(sub), (), {}))
    assert script.labels == [
        "RunChild wf-1:child:0",
        "Execute get_cancel_request",
        "Execute record_step",
    ]


def test_a_budgeted_parent_refreshes_its_ledger_after_a_child() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_steps=10, spent_steps=2))
    script = Script(
        child_answer(Outcome(1)),
        statements={"get_budget": ledger_row(limit_steps=10, spent_steps=7)},
    )
    script.run(protocol.child(run, workflow_def(sub), (), {}))
    assert script.labels == ["RunChild wf-1:child:0", "Execute record_step", "Execute get_budget"]
    assert run.ledger is not None and run.ledger.spent_steps == 7


def test_a_replayed_child_is_not_run_again() -> None:
    run = make_run(records=[failed(0, "sub", ValueError("old"), StepKind.CHILD)])
    script = Script()
    with pytest.raises(ValueError, match="old"):
        script.run(protocol.child(run, workflow_def(sub), (), {}))
    assert script.ops == []


def test_a_child_in_exit_mode_writes_held_records_first() -> None:
    run = make_run(mode="exit")
    run.pending.append(held(0, "earlier"))
    script = Script(child_answer(Outcome(1)))
    script.run(protocol.child(run, workflow_def(sub), (), {}))
    assert script.labels[:2] == ["WriteSteps 1", "RunChild wf-1:child:0"]


def test_a_run_proves_its_claim_again_only_when_its_lease_may_have_lapsed() -> None:
    run = make_run()
    lease = run.settings.lease_seconds
    run.doubts_seen, run.proven_at = 2, 100.0
    # The common case: nothing since the claim, renewed lately: two comparisons.
    assert protocol.reclaim(run, 2, 100.0 + lease / 3, 100.0 + lease / 3 + 1) is None
    assert protocol.reclaim(run, 2, 0.0, 100.0 + lease / 2 - 0.1) is None
    for asked in [
        protocol.reclaim(run, 3, 100.0, 100.1),  # an outage ended, or the heartbeat lagged
        protocol.reclaim(run, 2, 0.0, 100.0 + lease / 2),  # never renewed since the claim
        protocol.reclaim(run, 2, 100.0 + lease, 100.0 + 1.5 * lease),  # renewed too long ago
    ]:
        assert asked is not None and asked.name == "renew_claim" and asked.fetch == "one"
        assert asked.params == {"workflow_id": WORKFLOW_ID, "epoch": EPOCH, "lease_seconds": lease}


def test_a_proven_claim_is_recorded_and_a_lost_one_raises() -> None:
    run = make_run()
    run.doubts_seen, run.proven_at = 2, 100.0
    check = protocol.reclaim(run, 3, 100.0, 100.1)
    assert check is not None
    with pytest.raises(StaleOwnerError):
        protocol.proven(run, check, None)  # no row: another worker holds the workflow
    assert (run.doubts_seen, run.proven_at) == (2, 100.0)
    protocol.proven(run, check, {"epoch": EPOCH})
    assert (run.doubts_seen, run.proven_at) == (3, 100.1)
    assert protocol.reclaim(run, 3, 0.0, 100.2) is None  # proven just now


def test_a_branch_takes_its_positions_one_after_another_or_is_refused() -> None:
    run = make_run()
    protocol.check_branch_order(run, None, 4)  # its first call: anywhere
    protocol.check_branch_order(run, 4, 5)  # right after its own: what a replay gives
    with pytest.raises(BranchOrderError) as info:
        protocol.check_branch_order(run, 4, 6)  # a sibling took 5 in between
    assert (info.value.step_seq, info.value.previous) == (6, 4)
    assert isinstance(info.value, NondeterminismError)
    assert "child workflow" in str(info.value)


# -- starts from workflow code (start, submit, enqueue, start_child) ---------------------------


def journaled(params: dict[str, Any]) -> StepRecord:
    """What a replay reads back of a record_step the protocol asked for."""
    return StepRecord.from_row(params)


def test_a_start_takes_a_position_and_a_child_id_derived_from_it() -> None:
    run = make_run(records=[done(0, "fetch", 1)])
    run.journal.next_call("fetch")
    placed = protocol.place_start(run, "sub", None)
    assert placed == protocol.Placed(1, f"{WORKFLOW_ID}:child:1", False)
    assert protocol.place_start(run, "sub", "mine") == protocol.Placed(2, "mine", False)


def test_a_started_child_is_journaled_and_a_replay_adopts_it() -> None:
    run = make_run()
    placed = protocol.place_start(run, "sub", None)
    script = Script()
    script.run(protocol.record_start(run, placed, "sub"))
    record = script.only("record_step")
    assert (record["step_seq"], record["kind"], record["error"]) == (0, "child", None)
    assert record["child_workflow_id"] == f"{WORKFLOW_ID}:child:0"
    replay = make_run(records=[journaled(record)])
    again = protocol.place_start(replay, "sub", "ignored on a replay")
    assert again == protocol.Placed(0, f"{WORKFLOW_ID}:child:0", True)
    script = Script()
    script.run(protocol.record_start(replay, again, "sub"))
    assert script.ops == []  # journaled already: nothing written again


def test_a_start_cut_off_before_its_record_finds_the_same_child_id() -> None:
    # The crash point lies after the child's row and before the parent's: a run that dies
    # there leaves no record, and the next run derives the same id and stores nothing new.
    crashes: list[str] = []
    run = make_run(crash_point=crashes.append)
    placed = protocol.place_start(run, "sub", None)
    Script().run(protocol.record_start(run, placed, "sub"))
    assert crashes == ["after_child_start"]
    again = protocol.place_start(make_run(first_run=False), "sub", None)
    assert again == protocol.Placed(0, placed.workflow_id, False)


def test_a_dedup_refusal_is_journaled_and_raised_again_on_replay() -> None:
    run = make_run()
    placed = protocol.place_start(run, "sub", None)
    refusal = QueueDedupError("reports", "k", "holder-1")
    script = Script()
    script.run(protocol.record_start(run, placed, "sub", refusal))
    record = script.only("record_step")
    # An outcome, not a failure (a resume forgets failures at the end of a journal).
    assert (record["error"], record["child_workflow_id"]) == (None, None)
    assert json.loads(record["output"]) == {
        "refused": {"queue": "reports", "dedup_key": "k", "holder": "holder-1"}
    }
    replay = make_run(records=[journaled(record)])
    with pytest.raises(QueueDedupError) as info:
        protocol.place_start(replay, "sub", None)
    assert (info.value.queue, info.value.dedup_key, info.value.workflow_id) == (
        "reports",
        "k",
        "holder-1",
    )
    assert str(info.value) == str(refusal)
    assert replay.journal.next_seq == 1  # the refusal holds its position


@pytest.mark.parametrize(
    "error",
    [
        DatabaseUnavailableError("down"),
        StaleOwnerError(WORKFLOW_ID, EPOCH),
        WorkflowConflictError("wf-1:child:0", "other", "sub"),
        ValueError("bad arguments"),
    ],
)
def test_other_start_errors_are_not_journaled(error: Exception) -> None:
    run = make_run()
    placed = protocol.place_start(run, "sub", None)
    script = Script()
    script.run(protocol.record_start(run, placed, "sub", error))
    assert script.ops == []


def test_a_start_replayed_over_another_kind_of_record_is_refused() -> None:
    run = make_run(records=[done(0, "sub", {"not": "a refusal"}, StepKind.CHILD)])
    with pytest.raises(NondeterminismError):
        protocol.place_start(run, "sub", None)
    run = make_run(records=[failed(0, "sub", KeyError("k"), StepKind.CHILD)])
    with pytest.raises(KeyError):
        protocol.place_start(run, "sub", None)


def test_a_refusal_journaled_in_exit_mode_writes_held_records_first() -> None:
    run = make_run(mode="exit")
    run.pending.append(held(0, "earlier"))
    placed = protocol.place_start(run, "sub", None)
    script = Script()
    script.run(protocol.record_start(run, placed, "sub", QueueDedupError("q", "k", None)))
    assert script.labels == ["WriteSteps 1", "Execute record_step"]
