"""@step and @tool: replay or execute, retries, the journal write, charges and stopping."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import Ledger, RetryPolicy, StepKind
from durable._core import (
    AppFault,
    Call,
    Fault,
    LeaseClock,
    Outcome,
    Pause,
    RecordStep,
    decode_error,
    rebuild_error,
)
from durable.errors import (
    DatabaseUnavailableError,
    NondeterminismError,
    PayloadTooLargeError,
    SerializationError,
    StaleOwnerError,
    StepError,
    WorkflowInterrupted,
)
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    T0,
    WORKFLOW_ID,
    Raise,
    Script,
    Then,
    done,
    failed,
    ledger_row,
    llm,
    make_run,
    step_def,
)


def fetch(x: int = 1) -> dict[str, int]:
    return {"x": x}


class Custom(Exception):
    pass


def always_failing(error: Exception) -> Any:
    def flaky() -> None:
        raise error

    return flaky


def fails_then_returns(failures: int, value: Any) -> Any:
    calls = {"n": 0}

    def flaky() -> Any:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise ValueError(f"attempt {calls['n']}")
        return value

    return flaky


# -- replay and nondeterminism --------------------------------------------------------------


def test_replay_returns_journaled_output_without_calling() -> None:
    run = make_run(records=[done(0, "fetch", {"x": 41})])
    script = Script()
    assert script.run(protocol.step(run, step_def(fetch), (5,), {})) == {"x": 41}
    assert script.ops == []
    assert run.journal.next_seq == 1


def test_replay_of_a_failed_builtin_error_rebuilds_it() -> None:
    run = make_run(records=[failed(0, "fetch", KeyError("k"))])
    script = Script()
    with pytest.raises(KeyError) as info:
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert isinstance(info.value.__cause__, StepError)
    assert info.value.__cause__.error_type == "builtins.KeyError"
    assert script.ops == []


def test_replay_of_a_failed_custom_error_raises_step_error() -> None:
    run = make_run(records=[failed(0, "fetch", Custom("boom"))])
    script = Script()
    with pytest.raises(StepError) as info:
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert info.value.step_name == "fetch"
    assert info.value.error_type.endswith("test_protocol_steps.Custom")
    assert info.value.error_message == "boom"
    assert "Custom: boom" in info.value.traceback
    assert script.ops == []


def test_builtin_error_that_needs_more_arguments_becomes_step_error() -> None:
    original = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    rebuilt = rebuild_error("decode", protocol.encode_error(original))
    assert type(rebuilt) is StepError
    assert rebuilt.error_type == "builtins.UnicodeDecodeError"


def test_another_step_at_a_journaled_position_is_nondeterminism() -> None:
    run = make_run(records=[done(0, "fetch", {"x": 1})])
    script = Script()
    with pytest.raises(NondeterminismError) as info:
        script.run(protocol.step(run, step_def(fetch, "other"), (), {}))
    assert (info.value.step_seq, info.value.recorded, info.value.current) == (0, "fetch", "other")
    assert script.ops == []


def test_positions_continue_after_the_journal_ends() -> None:
    run = make_run(records=[done(0, "fetch", {"x": 1})])
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.run(protocol.step(run, step_def(fetch), (2,), {})) == {"x": 2}
    assert script.labels == ["Call fetch", "Execute record_step"]
    assert script.only("record_step")["step_seq"] == 1


# -- a fresh step ---------------------------------------------------------------------------


def test_fresh_step_calls_then_records() -> None:
    run = make_run()
    script = Script()
    assert script.run(protocol.step(run, step_def(fetch), (7,), {})) == {"x": 7}
    call, write = script.ops
    assert call == Call(fetch, (7,), {}, protocol.StepScope("fetch", charging=True, seq=0))
    assert write == RecordStep(
        {
            "workflow_id": WORKFLOW_ID,
            "epoch": EPOCH,
            "step_seq": 0,
            "step_name": "fetch",
            "kind": "step",
            "output": '{"x":7}',
            "error": None,
            "attempts": 1,
            "child_workflow_id": None,
            "started_at": T0,
        },
    )


def test_the_call_runs_as_a_charging_step_scope() -> None:
    run = make_run()
    seen: list[tuple[str, bool]] = []

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            assert op.scope is not None
            seen.append((op.scope.name, op.scope.charging))
        return DEFAULT

    Script(answer).run(protocol.step(run, step_def(fetch), (), {}))
    assert seen == [("fetch", True)]


def test_fence_refusal_raises_stale_owner() -> None:
    run = make_run()
    script = Script(statements={"record_step": 0})
    with pytest.raises(StaleOwnerError) as info:
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert (info.value.workflow_id, info.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_crash_point_between_call_and_record_leaves_nothing_recorded() -> None:
    class Killed(BaseException):
        pass

    points: list[str] = []

    def crash(name: str) -> None:
        points.append(name)
        if name == "before_step_record":
            raise Killed

    run = make_run(crash_point=crash)
    script = Script()
    with pytest.raises(Killed):
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.labels == ["Call fetch"]
    assert points == ["before_step", "before_step_record"]


# -- retries --------------------------------------------------------------------------------


def test_retries_back_off_then_record_the_error() -> None:
    error = ValueError("down")
    defn = step_def(
        always_failing(error),
        "flaky",
        retry=RetryPolicy(retries=2, initial_delay=1, backoff=2, jitter=0),
    )
    run = make_run()
    script = Script()
    with pytest.raises(ValueError) as info:
        script.run(protocol.step(run, defn, (), {}))
    assert info.value is error
    assert script.labels == [
        "Call flaky",
        "Pause 1",
        "Call flaky",
        "Pause 2",
        "Call flaky",
        "Execute record_step",
    ]
    written = script.only("record_step")
    assert written["attempts"] == 3
    assert written["output"] is None
    assert decode_error(written["error"])[:2] == ("builtins.ValueError", "down")


def test_a_retry_that_succeeds_records_the_attempts() -> None:
    defn = step_def(
        fails_then_returns(1, "ok"), "flaky", retry=RetryPolicy(retries=3, initial_delay=0.5)
    )
    run = make_run()
    script = Script()
    assert script.run(protocol.step(run, defn, (), {})) == "ok"
    assert [type(op) for op in script.ops] == [Call, Pause, Call, RecordStep]
    written = script.only("record_step")
    assert (written["attempts"], written["output"], written["error"]) == (2, '"ok"', None)


def test_retry_on_filters_which_errors_are_retried() -> None:
    defn = step_def(
        always_failing(ValueError("no")),
        "flaky",
        retry=RetryPolicy(retries=3, retry_on=(KeyError,), jitter=0),
    )
    script = Script()
    with pytest.raises(ValueError):
        script.run(protocol.step(make_run(), defn, (), {}))
    assert script.labels == ["Call flaky", "Execute record_step"]
    assert script.only("record_step")["attempts"] == 1


# -- what cannot be stored ------------------------------------------------------------------


def test_unserializable_output_raises_before_any_record() -> None:
    defn = step_def(lambda: object(), "opaque")
    script = Script()
    with pytest.raises(SerializationError, match="the output of step 'opaque'"):
        script.run(protocol.step(make_run(), defn, (), {}))
    assert [type(op) for op in script.ops] == [Call]


def test_output_over_the_payload_limit_raises_before_any_record() -> None:
    defn = step_def(lambda: "x" * 50, "big")
    script = Script()
    with pytest.raises(PayloadTooLargeError) as info:
        script.run(protocol.step(make_run(max_payload_bytes=20), defn, (), {}))
    assert (info.value.size, info.value.limit) == (52, 20)
    assert [type(op) for op in script.ops] == [Call]


# -- tools and charges ----------------------------------------------------------------------


def search(query: str, *, limit: int) -> list[str]:
    return [query] * limit


def test_tool_step_records_its_arguments_in_one_charged_write() -> None:
    run = make_run()

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            return Outcome(["a"], None, 0.25)
        return DEFAULT

    script = Script(
        answer, statements={"record_charged_step": {"written": True, "budget_id": None}}
    )
    defn = step_def(search, kind=StepKind.TOOL)
    assert script.run(protocol.step(run, defn, ("cats",), {"limit": 1})) == ["a"]
    assert script.labels == ["Call search", "Execute record_charged_step"]
    assert script.ops[1].fetch == "one"
    written = script.only("record_charged_step")
    assert written == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": 0,
        "step_name": "search",
        "kind": "tool",
        "output": '["a"]',
        "error": None,
        "attempts": 1,
        "started_at": T0,
        "budget_id": None,
        "dollars": Decimal(0),
        "tokens": 0,
        "steps": 0,
        "arguments": '{"args":["cats"],"kwargs":{"limit":1}}',
        "latency_ms": 250.0,
    }
    assert run.ledger is None


def test_tool_arguments_that_cannot_be_stored_stop_it_before_the_call() -> None:
    script = Script()
    with pytest.raises(SerializationError, match="the arguments of tool 'search'"):
        script.run(protocol.step(make_run(), step_def(search, kind=StepKind.TOOL), (object(),), {}))
    assert script.ops == []


def test_refused_charged_write_raises_stale_owner() -> None:
    script = Script(statements={"record_charged_step": {"written": False, "budget_id": None}})
    with pytest.raises(StaleOwnerError):
        script.run(
            protocol.step(make_run(), step_def(search, kind=StepKind.TOOL), ("q",), {"limit": 1})
        )


def test_charges_during_the_call_go_into_the_record_and_update_the_ledger() -> None:
    run = make_run(budget_id=WORKFLOW_ID)
    row = ledger_row(
        limit_dollars="5", spent_dollars="1.5", spent_tokens=30, spent_steps=4, written=True
    )

    scopes: list[Any] = []

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            scopes.append(op.scope)
            protocol.charge(run, op.scope, Decimal("0.5"), 10)
            return Outcome("reply")
        return DEFAULT

    script = Script(answer, statements={"record_charged_step": row})
    assert script.run(protocol.step(run, step_def(llm), (), {})) == "reply"
    written = script.only("record_charged_step")
    assert (written["dollars"], written["tokens"], written["steps"]) == (Decimal("0.5"), 10, 1)
    assert written["budget_id"] == WORKFLOW_ID
    assert written["arguments"] is None
    assert run.ledger == Ledger(WORKFLOW_ID, Decimal(5), None, None, Decimal("1.5"), 30, 4)
    assert (scopes[0].dollars, scopes[0].tokens) == (Decimal(0), 0)


def test_a_failed_attempt_charge_counts_after_the_retry() -> None:
    run = make_run()
    calls = {"n": 0}

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            calls["n"] += 1
            protocol.charge(run, op.scope, Decimal("0.25"), 5)
            return Outcome(error=ValueError("rate limited")) if calls["n"] == 1 else Outcome("ok")
        return DEFAULT

    defn = step_def(llm, retry=RetryPolicy(retries=1, initial_delay=0, jitter=0))
    script = Script(
        answer, statements={"record_charged_step": {"written": True, "budget_id": None}}
    )
    script.run(protocol.step(run, defn, (), {}))
    written = script.only("record_charged_step")
    assert (written["dollars"], written["tokens"], written["attempts"]) == (Decimal("0.5"), 10, 2)
    # Unbudgeted: a charge is recorded, but no step is counted against a ledger.
    assert written["steps"] == 0


def test_an_uncharged_step_of_an_unbudgeted_run_is_a_plain_record() -> None:
    script = Script()
    script.run(protocol.step(make_run(), step_def(fetch), (), {}))
    assert script.executed("record_charged_step") == []


# -- cancellation and timeout ---------------------------------------------------------------


def test_cancel_request_interrupts_a_new_step_before_the_call() -> None:
    run = make_run(cancel="user asked")
    script = Script()
    with pytest.raises(WorkflowInterrupted) as info:
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert (info.value.reason, info.value.timed_out) == ("user asked", False)
    assert script.ops == []


def test_a_replayed_step_never_interrupts() -> None:
    run = make_run(records=[done(0, "fetch", 1)], cancel="user asked")
    assert Script().run(protocol.step(run, step_def(fetch), (), {})) == 1


def test_a_deadline_in_the_past_is_a_timeout() -> None:
    run = make_run(deadline=T0 - dt.timedelta(seconds=1))
    script = Script()
    with pytest.raises(WorkflowInterrupted) as info:
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert (info.value.reason, info.value.timed_out) == ("timeout", True)
    assert script.ops == []


def test_a_deadline_still_ahead_lets_the_step_run() -> None:
    run = make_run(deadline=T0 + dt.timedelta(seconds=1))
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.labels == ["Call fetch", "Execute record_step"]


def test_cancel_reason_from_the_claim_interrupts() -> None:
    run = make_run(cancel_reason="shutdown")
    with pytest.raises(WorkflowInterrupted, match="shutdown"):
        Script().run(protocol.step(run, step_def(fetch), (), {}))


def test_a_stopping_run_is_not_interrupted_again() -> None:
    run = make_run(cancel="user asked", stopping=True)
    script = Script()
    script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.labels == ["Call fetch", "Execute record_step"]


# -- a record write cut off by an outage ------------------------------------------------------


def _journal_key(name: str = "steps_pkey") -> Any:
    """classify_app_error for a unique violation of `name` (the journal's key)."""

    class Taken(Exception):
        pass

    def classify(exc: BaseException) -> AppFault | None:
        return AppFault(Fault.UNIQUE, name) if isinstance(exc, Taken) else None

    return Taken, classify


def _outage() -> DatabaseUnavailableError:
    return DatabaseUnavailableError("lost the system database while running 'record_step'")


def test_a_record_cut_off_by_an_outage_is_sent_again_with_the_same_epoch() -> None:
    """Before it reached the server, or rolled back there: the record is not written, and
    the same fenced write goes again once the database answers; the step ran once."""
    calls: list[int] = []

    def charge() -> str:
        calls.append(1)
        return "charged"

    script = Script(statements={"record_step": Then(Raise(_outage()), Raise(_outage()), 1)})
    assert script.run(protocol.step(make_run(), step_def(charge), (), {})) == "charged"
    assert calls == [1]
    assert script.labels == [
        "Call charge",
        "Execute record_step",
        "LeaseClock",
        script.labels[3],  # Pause (with jitter)
        "Execute record_step",
        "LeaseClock",
        script.labels[6],
        "Execute record_step",
    ]
    assert all(isinstance(script.ops[i], Pause) for i in (3, 6))
    sent = script.executed("record_step")
    assert sent[0] == sent[1] == sent[2] and sent[0]["epoch"] == EPOCH


@pytest.mark.parametrize("constraint", ["steps_pkey", "steps_pkey_102008"])
def test_a_record_committed_before_its_answer_was_lost_is_found_written(constraint: str) -> None:
    """The first send committed and only its answer was lost: the second meets the record
    at its position (the journal's key, on one server or a Citus shard), which only this
    run's epoch can have written. The step returns; nothing runs again."""
    taken, classify = _journal_key(constraint)
    script = Script(statements={"record_step": Then(Raise(_outage()), Raise(taken()))})
    run = make_run(classify_app_error=classify)
    assert script.run(protocol.step(run, step_def(fetch), (2,), {})) == {"x": 2}
    assert len(script.executed("record_step")) == 2


def test_a_unique_violation_of_another_key_on_the_resend_is_not_a_record_found() -> None:
    taken, classify = _journal_key("steps_name_check")
    script = Script(statements={"record_step": Then(Raise(_outage()), Raise(taken()))})
    with pytest.raises(taken):
        script.run(protocol.step(make_run(classify_app_error=classify), step_def(fetch), (), {}))


def test_a_record_resent_after_another_owner_took_over_is_refused_by_the_fence() -> None:
    """The lease ran out during the outage and another worker claimed the workflow: the
    resend writes nothing, the run stops (StaleOwnerError) and the new owner runs the step."""
    script = Script(statements={"record_step": Then(Raise(_outage()), 0)})
    with pytest.raises(StaleOwnerError):
        script.run(protocol.step(make_run(), step_def(fetch), (), {}))


def test_a_record_is_given_up_once_the_lease_has_surely_lapsed() -> None:
    """Past a lease since the claim was last proven or renewed, another worker may own the
    workflow: the outage is raised (the run is interrupted and recovered), nothing resent."""
    run = make_run(proven_at=100.0)
    lapsed = 100.0 + run.settings.lease_seconds

    def answer(op: Any) -> Any:
        return (lapsed, 50.0) if isinstance(op, LeaseClock) else DEFAULT

    script = Script(answer, statements={"record_step": Raise(_outage())})
    with pytest.raises(DatabaseUnavailableError):
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert script.labels == ["Call fetch", "Execute record_step", "LeaseClock"]


def test_a_heartbeat_renewal_keeps_the_record_being_resent() -> None:
    """The lease counts from the later of the run's own proof and the heartbeat's last
    renewal of every lease; the outage that outlasts it is raised."""
    run = make_run(proven_at=0.0)
    lease = run.settings.lease_seconds
    clocks = iter([(lease + 1.0, 5.0), (lease + 6.0, 5.0)])

    def answer(op: Any) -> Any:
        return next(clocks) if isinstance(op, LeaseClock) else DEFAULT

    script = Script(answer, statements={"record_step": Raise(_outage())})
    with pytest.raises(DatabaseUnavailableError):
        script.run(protocol.step(run, step_def(fetch), (), {}))
    assert len(script.executed("record_step")) == 2  # resent once, then given up


def test_a_charged_record_found_written_after_an_outage_reads_the_ledger_back() -> None:
    """The charged write committed, its answer (the budget's new totals) lost: the resend
    meets the record, the charge is in the ledger once, and the run's copy is read back."""
    taken, classify = _journal_key()
    run = make_run(budget_id=WORKFLOW_ID, classify_app_error=classify)
    run.ledger = Ledger(WORKFLOW_ID, Decimal(5), None, None, Decimal(1), 0, 1)

    def answer(op: Any) -> Any:
        if isinstance(op, Call):
            protocol.charge(run, op.scope, Decimal("0.5"), 10)
            return Outcome("reply")
        return DEFAULT

    stored = ledger_row(limit_dollars="5", spent_dollars="1.5", spent_tokens=10, spent_steps=2)
    script = Script(
        answer,
        statements={
            "record_charged_step": Then(Raise(_outage()), Raise(taken())),
            "get_budget": stored,
        },
    )
    assert script.run(protocol.step(run, step_def(llm), (), {})) == "reply"
    sent = script.executed("record_charged_step")
    assert len(sent) == 2 and sent[0] == sent[1]
    assert run.ledger == Ledger(WORKFLOW_ID, Decimal(5), None, None, Decimal("1.5"), 10, 2)
    assert run.inflight == []
