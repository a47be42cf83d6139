"""Long steps: when an attempt is given up, which attempt may heartbeat, what a watched
attempt writes, and that a refusal at a heartbeat ends the run instead of a retry."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import RetryPolicy
from durable._core import Call, Execute, Outcome, StepScope
from durable._core.heartbeats import begin_attempt, end_attempt
from durable.errors import (
    HeartbeatTimeoutError,
    StaleOwnerError,
    StepTimeoutError,
    WorkflowInterrupted,
)
from tests.unit.scripted import EPOCH, WORKFLOW_ID, Script, make_run, step_def


def _scope(heartbeat_timeout: float | None = None) -> StepScope:
    return StepScope("crawl", charging=True, seq=2, heartbeat_timeout=heartbeat_timeout)


# -- deadlines --------------------------------------------------------------------------------


def test_an_attempt_without_limits_is_never_given_up() -> None:
    scope = _scope()
    assert protocol.attempt_deadline(scope, 100.0, None) is None
    assert protocol.give_up(scope, 100.0, None, 1e9) is None


def test_a_timeout_gives_the_attempt_up_with_step_timeout_error() -> None:
    scope = _scope()
    scope.live = 1
    assert protocol.attempt_deadline(scope, 100.0, 3.0) == (103.0, False)
    assert protocol.give_up(scope, 100.0, 3.0, 102.9) is None
    assert scope.live == 1
    error = protocol.give_up(scope, 100.0, 3.0, 103.0)
    assert type(error) is StepTimeoutError
    assert scope.live is None  # a given-up attempt may no longer heartbeat


def test_a_heartbeat_moves_the_heartbeat_deadline_not_the_timeout() -> None:
    scope = _scope(heartbeat_timeout=5.0)
    scope.live = 1
    assert protocol.attempt_deadline(scope, 100.0, 60.0) == (105.0, True)
    scope.beat_at = 104.0
    assert protocol.attempt_deadline(scope, 100.0, 60.0) == (109.0, True)
    scope.beat_at = 158.0
    assert protocol.attempt_deadline(scope, 100.0, 60.0) == (160.0, False)
    scope.beat_at = 104.0
    assert protocol.give_up(scope, 100.0, 60.0, 108.0) is None
    error = protocol.give_up(scope, 100.0, 60.0, 109.0)
    assert isinstance(error, HeartbeatTimeoutError) and isinstance(error, StepTimeoutError)
    assert "heartbeat_timeout of 5 s" in str(error)


# -- which attempt may heartbeat ----------------------------------------------------------------


def test_only_the_live_attempt_may_heartbeat() -> None:
    run = make_run()
    scope = _scope(heartbeat_timeout=5.0)
    moved: list[float] = []
    scope.on_beat = lambda: moved.append(scope.beat_at)
    scope.live = 2
    protocol.beat(run, scope, 2, 7.0)
    assert (scope.beat_at, moved) == (7.0, [7.0])
    with pytest.raises(StaleOwnerError):
        protocol.beat(run, scope, 1, 8.0)  # a given-up attempt's thread, running on
    scope.live = None
    with pytest.raises(StaleOwnerError):
        protocol.beat(run, scope, 2, 8.0)  # between attempts, or given up
    assert scope.beat_at == 7.0


def test_a_cancel_is_raised_at_the_next_heartbeat() -> None:
    run = make_run(cancel="enough")
    scope = _scope()
    scope.live = 1
    with pytest.raises(WorkflowInterrupted) as raised:
        protocol.beat(run, scope, 1, 1.0)
    assert raised.value.reason == "enough" and not raised.value.timed_out


def test_a_refused_background_write_is_raised_at_the_next_heartbeat() -> None:
    run = make_run()
    scope = _scope()
    scope.live = 1
    scope.beat_error = StaleOwnerError(WORKFLOW_ID, EPOCH)
    with pytest.raises(StaleOwnerError):
        protocol.beat(run, scope, 1, 1.0)


# -- what is written ----------------------------------------------------------------------------


def test_an_unwatched_attempt_writes_nothing_to_begin_or_end() -> None:
    run = make_run()
    scope = _scope()
    script = Script()
    script.run(begin_attempt(run, scope, 1))
    assert scope.live == 1 and not scope.details_read
    script.run(end_attempt(run, scope, 1))
    assert scope.live is None and script.ops == []


def test_a_watched_attempt_begins_with_its_row_and_reads_the_last_details() -> None:
    run = make_run()
    scope = _scope(heartbeat_timeout=5.0)
    script = Script(statements={"begin_step_attempt": {"details": "7"}})
    script.run(begin_attempt(run, scope, 2))
    (op,) = script.ops
    assert op == Execute(
        "begin_step_attempt",
        {
            "workflow_id": WORKFLOW_ID,
            "step_seq": 2,
            "epoch": EPOCH,
            "attempt": 2,
            "heartbeat_timeout": 5.0,
        },
        "one",
    )
    assert (scope.live, scope.last_details, scope.details_read) == (2, "7", True)
    script.run(end_attempt(run, scope, 2))
    assert script.ops[-1].name == "end_step_attempt"
    assert script.ops[-1].params["attempt"] == 2


def test_a_run_that_lost_the_workflow_cannot_begin_a_watched_attempt() -> None:
    run = make_run()
    scope = _scope(heartbeat_timeout=5.0)
    script = Script(statements={"begin_step_attempt": None})
    with pytest.raises(StaleOwnerError):
        script.run(begin_attempt(run, scope, 1))


def test_a_heartbeat_reads_the_last_details_first_then_writes() -> None:
    run = make_run()
    scope = _scope()
    scope.live = 1
    script = Script(
        statements={"last_step_heartbeat": {"details": "4"}, "heartbeat_step": {"written": 1}}
    )
    script.run(protocol.write_beat(run, scope, 1, "5"))
    assert [op.name for op in script.ops] == ["last_step_heartbeat", "heartbeat_step"]
    assert script.ops[1].params["details"] == "5"
    assert scope.last_details == "4"  # what the attempt resumed from, not its own
    script.run(protocol.write_beat(run, scope, 1, "6"))
    assert [op.name for op in script.ops][2:] == ["heartbeat_step"]
    assert script.run(protocol.read_last(run, scope)) == "4"


def test_a_refused_heartbeat_raises_stale_owner() -> None:
    run = make_run()
    scope = _scope()
    scope.details_read = True
    script = Script(statements={"heartbeat_step": None})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.write_beat(run, scope, 1, None))


# -- in a step ----------------------------------------------------------------------------------


def _never_called() -> None:
    raise AssertionError("answered by the script")


def test_a_refusal_at_a_heartbeat_ends_the_run_not_retried() -> None:
    run = make_run()
    defn = dataclasses.replace(
        step_def(_never_called, retry=RetryPolicy(retries=5, initial_delay=0, jitter=0)),
        heartbeat_timeout=5.0,
    )
    calls: list[int] = []

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            calls.append(op.scope.live)
            return Outcome(None, StaleOwnerError(WORKFLOW_ID, EPOCH))
        if isinstance(op, Execute) and op.name == "begin_step_attempt":
            return {"details": None}
        return None if isinstance(op, Execute) and op.fetch == "one" else 1

    with pytest.raises(StaleOwnerError):
        Script(answer).run(protocol.step(run, defn, (), {}))
    assert calls == [1]


def test_a_given_up_attempt_is_retried_as_the_next_attempt() -> None:
    run = make_run()
    defn = dataclasses.replace(
        step_def(_never_called, retry=RetryPolicy(retries=1, initial_delay=0, jitter=0)),
        heartbeat_timeout=5.0,
    )
    outcomes = [Outcome(None, HeartbeatTimeoutError("crawl", 5.0)), Outcome("done")]

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            return outcomes.pop(0)
        if isinstance(op, Execute) and op.name == "begin_step_attempt":
            return {"details": '"page 3"'}
        return None if isinstance(op, Execute) and op.fetch == "one" else 1

    script = Script(answer)
    assert script.run(protocol.step(run, defn, (), {})) == "done"
    names = [(op.name, op.params.get("attempt")) for op in script.ops if isinstance(op, Execute)]
    assert names[:4] == [
        ("begin_step_attempt", 1),
        ("end_step_attempt", 1),
        ("begin_step_attempt", 2),
        ("end_step_attempt", 2),
    ]


# -- outside a running step -------------------------------------------------------------------


def test_a_heartbeat_outside_a_running_step_is_refused_with_the_fix() -> None:
    # A heartbeat that went nowhere would let the step be given up for not heartbeating.
    import durable
    from durable.errors import NotInStepError, NotInWorkflowError

    with pytest.raises(NotInStepError, match=r"copy_context\(\)\.run") as refused:
        durable.heartbeat({"page": 1})
    assert isinstance(refused.value, NotInWorkflowError)
    with pytest.raises(NotInStepError, match=r"durable\.last_heartbeat\(\)"):
        durable.last_heartbeat()
