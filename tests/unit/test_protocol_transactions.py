"""@transaction and @step in the pure core, the decisions the other tests leave open: the
exact journal record of each way a transaction ends (its error, its misuse, an adopted
app-side record), how many times a conflict runs it again, which faults mean another
owner, and a step's record (its latency, its arguments, what it charged) and timeout."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import RetryPolicy, StepKind
from durable._core import AppBegin, AppEnd, AppFault, Call, Fault, Outcome, Pause
from durable._core.journal import decode_error
from durable._core.ops import CONFLICT_ATTEMPTS
from durable.errors import (
    BudgetExceededError,
    DatabaseUnavailableError,
    NondeterminismError,
    StaleOwnerError,
    TransactionStepError,
)
from tests.unit.scripted import (
    CONFLICT,
    DEFAULT,
    EPOCH,
    FENCE,
    READ_ONLY,
    T0,
    WORKFLOW_ID,
    Raise,
    Script,
    after_one_step,
    make_run,
    step_def,
)

WRITTEN = {"record_charged_step": {"written": 1, "budget_id": None}}


def move_money(conn: Any, cents: int) -> dict[str, int]:
    return {"moved": cents}


def txn(fn: Any = move_money) -> Any:
    return step_def(fn, "move_money", kind=StepKind.TRANSACTION)


def failure_record(error: str | None) -> dict[str, Any]:
    return {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": 1,
        "step_name": "move_money",
        "kind": "transaction",
        "output": None,
        "error": error,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": T0,
    }


def test_a_user_error_is_journaled_at_its_position_with_its_start() -> None:
    def overdrawn(conn: Any, cents: int) -> None:
        raise ValueError("overdrawn")

    script = Script()
    with pytest.raises(ValueError):
        script.run(protocol.transaction(after_one_step(), txn(overdrawn), (1,), {}))
    record = script.only("record_step")
    assert record == failure_record(record["error"])
    assert script.ops[2] == AppEnd(commit=False)


def test_a_user_error_in_a_separate_database_is_journaled_too() -> None:
    def overdrawn(conn: Any, cents: int) -> None:
        raise ValueError("overdrawn")

    script = Script()
    with pytest.raises(ValueError):
        script.run(
            protocol.transaction(after_one_step(app_separate=True), txn(overdrawn), (1,), {})
        )
    assert decode_error(script.only("record_step")["error"])[1] == "overdrawn"


def test_the_record_goes_with_the_commit_between_its_crash_points() -> None:
    points: list[str] = []
    script = Script()
    script.run(protocol.transaction(make_run(crash_point=points.append), txn(), (1,), {}))
    assert points == ["before_transaction_commit", "after_transaction_commit"]
    assert script.ops[-1].commit is True


def test_code_that_ended_the_transaction_is_a_misuse_naming_the_step() -> None:
    script = Script(statements={"record_step_in_app": None})
    with pytest.raises(TransactionStepError) as caught:
        script.run(protocol.transaction(after_one_step(), txn(), (1,), {}))
    assert caught.value.step_name == "move_money"
    record = script.only("record_step")
    assert record == failure_record(record["error"])


def test_an_aborted_transaction_is_a_misuse_naming_the_step() -> None:
    script = Script(statements={"record_step_in_app": protocol.ABORTED})
    with pytest.raises(TransactionStepError) as caught:
        script.run(protocol.transaction(after_one_step(), txn(), (1,), {}))
    assert caught.value.step_name == "move_money"


def test_a_read_only_misuse_is_journaled_at_its_position() -> None:
    refused = RuntimeError("read-only transaction")
    run = after_one_step(classify_app_error=lambda exc: READ_ONLY if exc is refused else None)
    script = Script(
        statements={"record_step_in_app": Raise(refused), "app_refuses_writes": {"refuses": False}}
    )
    with pytest.raises(TransactionStepError) as caught:
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert caught.value.step_name == "move_money"
    record = script.only("record_step")
    assert record == failure_record(record["error"])
    assert "TransactionStepError" in decode_error(record["error"])[0]
    # The question is asked in a transaction of its own, rolled back.
    assert script.ops[-3:-1] == [
        protocol.AppExecute("app_refuses_writes", {}, "one"),
        AppEnd(commit=False),
    ]


def test_a_read_only_error_of_the_code_itself_is_its_own_error() -> None:
    refused = RuntimeError("read-only transaction")

    def reads_only(conn: Any, cents: int) -> None:
        raise refused

    run = after_one_step(classify_app_error=lambda exc: READ_ONLY if exc is refused else None)
    script = Script(statements={"app_refuses_writes": {"refuses": False}})
    with pytest.raises(RuntimeError) as caught:
        script.run(protocol.transaction(run, txn(reads_only), (1,), {}))
    assert caught.value is refused
    assert decode_error(script.only("record_step")["error"])[0] == "builtins.RuntimeError"


def test_a_conflict_runs_the_whole_transaction_again_after_a_backoff() -> None:
    collided = RuntimeError("could not serialize access")
    calls: list[int] = []

    def moves(conn: Any, cents: int) -> int:
        calls.append(cents)
        if len(calls) == 1:
            raise collided
        return cents

    run = make_run(classify_app_error=lambda exc: CONFLICT if exc is collided else None)
    script = Script()
    assert script.run(protocol.transaction(run, txn(moves), (7,), {})) == 7
    assert calls == [7, 7]
    assert script.labels[:5] == [
        "AppBegin",
        "AppCall moves",
        "AppEnd rollback",
        script.labels[3],
        "AppBegin",
    ]
    pause = script.ops[3]
    assert isinstance(pause, Pause) and 0.0 < pause.seconds <= 0.003


def test_conflicts_run_it_at_most_conflict_attempts_times_then_journal_the_error() -> None:
    collided = RuntimeError("could not serialize access")

    def always(conn: Any, cents: int) -> None:
        raise collided

    run = make_run(classify_app_error=lambda exc: CONFLICT if exc is collided else None)
    script = Script(limit=200)
    with pytest.raises(RuntimeError):
        script.run(protocol.transaction(run, txn(always), (1,), {}))
    assert len(script.of_type(AppBegin)) == CONFLICT_ATTEMPTS
    assert len(script.of_type(Pause)) == CONFLICT_ATTEMPTS - 1
    assert len(script.executed("record_step")) == 1


def test_a_refused_fence_names_the_run_that_lost() -> None:
    lost = RuntimeError("fence")
    run = make_run(classify_app_error=lambda exc: FENCE if exc is lost else None)
    script = Script(statements={"record_step_in_app": Raise(lost)})
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.transaction(run, txn(), (1,), {}))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_a_lost_connection_says_what_was_lost() -> None:
    gone = ConnectionError("server closed the connection")
    run = make_run(classify_app_error=lambda exc: AppFault(Fault.LOST) if exc is gone else None)
    script = Script(statements={"record_step_in_app": Raise(gone)})
    with pytest.raises(DatabaseUnavailableError, match="server closed the connection"):
        script.run(protocol.transaction(run, txn(), (1,), {}))


def test_an_adopted_record_is_journaled_as_the_transactions_at_its_position() -> None:
    run = after_one_step(app_separate=True)
    row = {"step_name": "move_money", "output": '{"moved":9}'}
    script = Script(statements={"app_get_transaction": row})
    assert script.run(protocol.transaction(run, txn(), (1,), {})) == {"moved": 9}
    record = script.only("record_step")
    assert record == {**failure_record(None), "output": '{"moved":9}'}
    assert script.ops[2] == AppEnd(commit=True)


def test_an_adopted_record_of_another_step_names_both() -> None:
    run = after_one_step(app_separate=True)
    script = Script(statements={"app_get_transaction": {"step_name": "other", "output": "1"}})
    with pytest.raises(NondeterminismError) as caught:
        script.run(protocol.transaction(run, txn(), (1,), {}))
    error = caught.value
    assert (error.workflow_id, error.step_seq) == (WORKFLOW_ID, 1)
    assert (error.recorded, error.current) == ("other", "move_money")


# -- steps -----------------------------------------------------------------------------------


def tool_def(fn: Any, **options: Any) -> Any:
    return dataclasses.replace(step_def(fn, kind=StepKind.TOOL, **options))


def test_a_steps_record_says_how_long_its_attempts_and_backoffs_took() -> None:
    calls: list[int] = []

    def lookup(q: str) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("slow")
        return "found"

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            outcome = Script()._default(op)
            return Outcome(outcome.value, outcome.error, 2.0)
        return DEFAULT

    defn = tool_def(lookup, retry=RetryPolicy(retries=1, initial_delay=0.5, jitter=0))
    script = Script(answer, statements=WRITTEN)
    assert script.run(protocol.step(after_one_step(), defn, ("q",), {})) == "found"
    record = script.only("record_charged_step")
    assert record["latency_ms"] == (2.0 + 0.5 + 2.0) * 1000.0
    assert record["attempts"] == 2 and record["step_seq"] == 1 and record["started_at"] == T0


def test_a_failed_tool_call_is_recorded_with_its_arguments_and_latency() -> None:
    def lookup(q: str) -> str:
        raise KeyError(q)

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            return Outcome(None, KeyError("q"), 1.5)
        return DEFAULT

    script = Script(answer, statements=WRITTEN)
    with pytest.raises(KeyError):
        script.run(protocol.step(after_one_step(), tool_def(lookup), ("q",), {}))
    record = script.only("record_charged_step")
    assert record["step_seq"] == 1 and record["started_at"] == T0
    assert record["latency_ms"] == 1500.0
    assert record["arguments"] == '{"args":["q"],"kwargs":{}}'
    assert record["output"] is None and "KeyError" in record["error"]


def test_a_step_is_called_with_its_timeout() -> None:
    def slow() -> int:
        return 1

    script = Script()
    defn = dataclasses.replace(step_def(slow), timeout=2.5)
    script.run(protocol.step(make_run(), defn, (), {}))
    assert script.of_type(Call)[0].timeout == 2.5


def test_a_budget_error_the_code_raises_itself_is_its_outcome() -> None:
    def spends() -> None:
        raise BudgetExceededError(WORKFLOW_ID, "spends", "its own words")

    script = Script()
    with pytest.raises(BudgetExceededError):
        script.run(protocol.step(make_run(), step_def(spends), (), {}))
    assert script.executed("get_approval") == []
    assert "BudgetExceededError" in script.only("record_step")["error"]


def charging(dollars: str, tokens: int) -> Any:
    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            op.scope.dollars, op.scope.tokens = Decimal(dollars), tokens
            return Outcome("ok", None, 0.0)
        return DEFAULT

    return answer


@pytest.mark.parametrize(("dollars", "tokens"), [("0.25", 0), ("0", 30)])
def test_a_step_that_charged_anything_writes_its_charge_with_its_record(
    dollars: str, tokens: int
) -> None:
    def llm() -> str:
        return "ok"

    script = Script(charging(dollars, tokens), statements=WRITTEN)
    script.run(protocol.step(make_run(), step_def(llm), (), {}))
    charged = script.only("record_charged_step")
    assert (charged["dollars"], charged["tokens"]) == (Decimal(dollars), tokens)
    assert charged["steps"] == 0  # no budget of its own to count steps in
    scope = script.of_type(Call)[0].scope
    assert (scope.dollars, scope.tokens) == (Decimal(0), 0)  # handed to the record


def test_a_refused_charged_record_forgets_the_charge_and_names_the_run() -> None:
    def llm() -> str:
        return "ok"

    script = Script(charging("0.25", 3), statements={"record_charged_step": None})
    with pytest.raises(StaleOwnerError) as caught:
        script.run(protocol.step(make_run(), step_def(llm), (), {}))
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)
    scope = script.of_type(Call)[0].scope
    assert (scope.dollars, scope.tokens) == (Decimal(0), 0)


def test_a_step_records_before_its_last_crash_point() -> None:
    points: list[str] = []

    def fetch() -> int:
        return 1

    script = Script()
    script.run(protocol.step(make_run(crash_point=points.append), step_def(fetch), (), {}))
    assert points == ["before_step", "before_step_record", "after_step_record"]
