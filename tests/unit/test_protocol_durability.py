"""Durability modes: which records wait, and the barriers that write them first."""

from __future__ import annotations

from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, WorkflowStatus
from durable._core import AppFault, AwaitWriter, Enqueue, Fault, RecordStep, WriteSteps
from durable.errors import DatabaseUnavailableError, StaleOwnerError, WorkflowSuspended
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    WORKFLOW_ID,
    Raise,
    Script,
    Then,
    done,
    effect_def,
    make_run,
    step_def,
)


def fetch() -> str:
    return "page"


def notify(*, idempotency_key: str) -> str:
    return "sent"


def move(conn: Any) -> int:
    return 1


def run_steps(run: Any, script: Script, n: int) -> None:
    for _ in range(n):
        script.run(protocol.step(run, step_def(fetch), (), {}))


# -- exit mode ------------------------------------------------------------------------------


def test_exit_mode_holds_plain_step_records() -> None:
    run = make_run(mode="exit")
    script = Script()
    run_steps(run, script, 2)
    assert script.labels == ["Call fetch", "Call fetch"]
    assert [row["step_seq"] for row in run.pending] == [0, 1]
    assert run.pending[0] == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": 0,
        "step_name": "fetch",
        "kind": "step",
        "output": '"page"',
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": run.settings.clock.now(),
    }


def test_exit_mode_writes_held_records_before_an_effect() -> None:
    run = make_run(mode="exit")
    script = Script()
    run_steps(run, script, 2)
    held = list(run.pending)
    script.run(protocol.effect(run, effect_def(notify), (), {}))
    assert script.labels[2:] == [
        "WriteSteps 2",
        "Execute effect_intent",
        "Call notify",
        "Execute settle_effect",
    ]
    assert script.of_type(WriteSteps)[0].rows == held
    assert run.pending == []


def test_exit_mode_writes_held_records_before_a_transaction() -> None:
    run = make_run(mode="exit")
    script = Script()
    run_steps(run, script, 1)
    script.run(protocol.transaction(run, step_def(move, kind=StepKind.TRANSACTION), (), {}))
    assert script.labels[1:3] == ["WriteSteps 1", "AppBegin"]


def test_exit_mode_writes_held_records_with_the_finish_in_one_operation() -> None:
    run = make_run(mode="exit")
    script = Script()
    run_steps(run, script, 3)
    script.run(protocol.finish(run, WorkflowStatus.SUCCESS, '"ok"', None))
    assert script.labels[3:] == ["WriteSteps 3"]
    (write,) = [op for op in script.ops if isinstance(op, WriteSteps)]
    assert write.finish == {
        "workflow_id": WORKFLOW_ID,
        "epoch": run.epoch,
        "status": "SUCCESS",
        "output": '"ok"',
        "error": None,
    }
    assert run.pending == []


def test_exit_mode_with_nothing_held_finishes_with_one_statement() -> None:
    script = Script()
    script.run(protocol.finish(make_run(mode="exit"), WorkflowStatus.SUCCESS, None, None))
    assert script.labels == ["Execute finish_workflow"]


def test_a_barrier_with_nothing_held_writes_nothing() -> None:
    script = Script()
    script.run(protocol.barrier(make_run(mode="exit")))
    assert script.ops == []


def test_held_records_refused_for_a_stale_run_raise_stale_owner() -> None:
    run = make_run(mode="exit")
    script = Script(lambda op: [WORKFLOW_ID] if isinstance(op, WriteSteps) else DEFAULT)
    run_steps(run, script, 2)
    with pytest.raises(StaleOwnerError):
        script.run(protocol.finish(run, WorkflowStatus.SUCCESS, None, None))
    assert script.executed("finish_workflow") == []
    assert run.pending == []


# -- held records cut off by an outage ----------------------------------------------------------


def _cut_then(*answers: Any) -> Any:
    """WriteSteps' answers in turn: an outage first, then each of `answers` (a list of
    ids written, or an exception to raise)."""
    left = [DatabaseUnavailableError("lost the system database in 'record_steps'"), *answers]

    def answer(op: Any) -> Any:
        if not isinstance(op, WriteSteps):
            return DEFAULT
        got = left.pop(0)
        return Raise(got) if isinstance(got, BaseException) else got

    return answer


def test_held_records_cut_off_by_an_outage_are_sent_again_at_a_barrier() -> None:
    """An exit-mode run's held records are of calls that ran: an outage that cuts their
    write off at a barrier has them sent again, the same rows at the same epoch, while the
    lease may hold, not dropped (the run would be interrupted and run those calls again)."""
    run = make_run(mode="exit")
    script = Script(_cut_then([WORKFLOW_ID, WORKFLOW_ID]))
    run_steps(run, script, 2)
    script.run(protocol.barrier(run))
    writes = script.of_type(WriteSteps)
    assert len(writes) == 2 and writes[0].rows == writes[1].rows
    assert all(row["epoch"] == EPOCH for row in writes[1].rows)
    assert script.labels[2:5] == ["WriteSteps 2", "LeaseClock", script.labels[4]]


def test_held_records_found_written_by_the_first_send_are_not_refused() -> None:
    """The first send committed and only its answer was lost: the resend meets the rows at
    their positions (the journal's key), so they are written, as the first send wrote them."""

    class Taken(Exception):
        pass

    def classify(exc: BaseException) -> AppFault | None:
        return AppFault(Fault.UNIQUE, "steps_pkey") if isinstance(exc, Taken) else None

    run = make_run(mode="exit", classify_app_error=classify)
    script = Script(_cut_then(Taken()))
    run_steps(run, script, 2)
    script.run(protocol.barrier(run))
    assert len(script.of_type(WriteSteps)) == 2


def test_held_records_and_the_outcome_cut_off_are_sent_again_with_it() -> None:
    run = make_run(mode="exit")
    script = Script(_cut_then([WORKFLOW_ID]))
    run_steps(run, script, 1)
    script.run(protocol.finish(run, WorkflowStatus.SUCCESS, '"ok"', None))
    writes = script.of_type(WriteSteps)
    assert len(writes) == 2 and writes[0] == writes[1]
    assert script.executed("get_workflow") == []


def test_an_outcome_committed_before_its_answer_was_lost_is_found_written() -> None:
    """The resend of the records with the outcome writes nothing (the first send committed
    them, and the workflow is no longer this run's to finish): the row, read, is this run's
    outcome at its epoch, so the run ends as finished, not as a stale owner."""
    finished = {"epoch": EPOCH, "status": "SUCCESS", "owner": None}
    run = make_run(mode="exit")
    script = Script(_cut_then([]), statements={"get_workflow": finished})
    run_steps(run, script, 1)
    script.run(protocol.finish(run, WorkflowStatus.SUCCESS, '"ok"', None))
    assert len(script.executed("get_workflow")) == 1


def test_the_read_after_a_resend_that_wrote_nothing_outlasts_an_outage_too() -> None:
    finished = {"epoch": EPOCH, "status": "SUCCESS", "owner": None}
    cut = DatabaseUnavailableError("lost the system database in 'get_workflow'")
    run = make_run(mode="exit")
    script = Script(_cut_then([]), statements={"get_workflow": Then(Raise(cut), finished)})
    run_steps(run, script, 1)
    script.run(protocol.finish(run, WorkflowStatus.SUCCESS, '"ok"', None))
    assert len(script.executed("get_workflow")) == 2


def test_an_outcome_resent_after_another_owner_took_over_is_a_stale_owner() -> None:
    claimed = {"epoch": EPOCH + 1, "status": "RUNNING", "owner": "another"}
    run = make_run(mode="exit")
    script = Script(_cut_then([]), statements={"get_workflow": claimed})
    run_steps(run, script, 1)
    with pytest.raises(StaleOwnerError):
        script.run(protocol.finish(run, WorkflowStatus.SUCCESS, '"ok"', None))


def test_exit_mode_writes_a_non_lazy_record_after_the_held_ones() -> None:
    # A sleep's wake time is a barrier record: the held steps go first.
    run = make_run(mode="exit")
    script = Script(statements={"suspend_until": 1})
    run_steps(run, script, 1)
    with pytest.raises(WorkflowSuspended):
        script.run(protocol.sleep(run, 60))
    assert script.labels[1:] == [
        "WriteSteps 1",
        "Execute record_step",
        "Park",
        "Execute suspend_until",
    ]


def test_exit_mode_writes_held_records_before_a_charged_write() -> None:
    run = make_run(mode="exit")
    script = Script(statements={"record_charged_step": {"written": True, "budget_id": None}})
    run_steps(run, script, 1)
    script.run(protocol.step(run, step_def(fetch, "tool", kind=StepKind.TOOL), (), {}))
    assert script.labels == [
        "Call fetch",
        "Call fetch",
        "WriteSteps 1",
        "Execute record_charged_step",
    ]


# -- async mode -----------------------------------------------------------------------------


def test_async_mode_hands_plain_records_to_the_writer() -> None:
    run = make_run(mode="async")
    script = Script()
    run_steps(run, script, 1)
    assert script.labels == ["Call fetch", "Enqueue fetch"]
    enqueued = script.of_type(Enqueue)[0].row
    assert (enqueued["step_seq"], enqueued["output"]) == (0, '"page"')
    assert run.pending == []


def test_async_mode_waits_for_the_writer_at_a_barrier() -> None:
    run = make_run(mode="async")
    script = Script()
    run_steps(run, script, 1)
    script.run(protocol.finish(run, WorkflowStatus.SUCCESS, None, None))
    assert script.labels == [
        "Call fetch",
        "Enqueue fetch",
        "AwaitWriter",
        "Execute finish_workflow",
    ]


def test_async_mode_waits_for_the_writer_before_a_barrier_record() -> None:
    run = make_run(mode="async")
    script = Script()
    script.run(protocol.record(run, 0, "child", StepKind.CHILD, '"x"'))
    assert [type(op) for op in script.ops] == [AwaitWriter, RecordStep]


def test_a_writer_refusal_at_the_barrier_reaches_the_caller() -> None:
    run = make_run(mode="async")
    stale = StaleOwnerError(WORKFLOW_ID, EPOCH)

    def answer(op: Any) -> Any:
        if isinstance(op, AwaitWriter):
            raise stale  # the driver raises it when the writer's rows were refused
        return DEFAULT

    script = Script(answer)
    with pytest.raises(StaleOwnerError) as info:
        script.run(protocol.finish(run, WorkflowStatus.SUCCESS, None, None))
    assert info.value is stale
    assert script.executed("finish_workflow") == []


# -- sync mode ------------------------------------------------------------------------------


def test_sync_mode_writes_each_record_at_once() -> None:
    run = make_run(mode="sync")
    script = Script()
    run_steps(run, script, 2)
    assert script.labels == [
        "Call fetch",
        "Execute record_step",
        "Call fetch",
        "Execute record_step",
    ]
    assert [p["step_seq"] for p in script.executed("record_step")] == [0, 1]


def test_sync_mode_barrier_asks_nothing() -> None:
    script = Script()
    script.run(protocol.barrier(make_run(mode="sync")))
    assert script.ops == []


# -- working state and conversation turns ---------------------------------------------------


def test_state_is_a_lazy_record() -> None:
    run = make_run(mode="exit")
    script = Script()
    script.run(protocol.set_state(run, {"plan": ["a"]}))
    assert script.ops == []
    assert run.state == '{"plan":["a"]}'
    (row,) = run.pending
    assert (row["step_name"], row["kind"], row["output"]) == (
        "durable.state",
        "state",
        '{"plan":["a"]}',
    )


def test_state_in_sync_mode_is_written_at_once() -> None:
    script = Script()
    script.run(protocol.set_state(make_run(), 1))
    assert script.only("record_step")["kind"] == "state"


def test_a_replayed_state_is_restored() -> None:
    run = make_run(records=[done(0, "durable.state", {"n": 2}, StepKind.STATE)])
    script = Script()
    script.run(protocol.set_state(run, {"n": 99}))
    assert script.ops == []
    assert run.state == '{"n":2}'


def test_turns_are_lazy_and_kept_in_order() -> None:
    run = make_run(mode="async")
    script = Script()
    script.run(protocol.append_turn(run, "user", "hi"))
    script.run(protocol.append_turn(run, "assistant", "hello"))
    assert script.labels == ["Enqueue durable.turn", "Enqueue durable.turn"]
    assert [row["step_seq"] for row in (op.row for op in script.of_type(Enqueue))] == [0, 1]
    assert run.turns == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]


def test_replayed_turns_rebuild_the_conversation() -> None:
    turn = {"role": "user", "content": "hi"}
    run = make_run(records=[done(0, "durable.turn", turn, StepKind.TURN)])
    script = Script()
    script.run(protocol.append_turn(run, "user", "changed"))
    assert script.ops == []
    assert run.turns == [turn]
