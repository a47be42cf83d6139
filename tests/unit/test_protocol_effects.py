"""@effect: intent -> pending -> applied, reconciliation, refused key reuse, approval first."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from durable._base.models import EffectStatus, RetryPolicy, StepKind
from durable._core import Call, Compensation, Execute, Pause, decode_error
from durable.errors import (
    ApprovalDeniedError,
    IdempotencyKeyReusedError,
    StaleOwnerError,
    WorkflowInterrupted,
    WorkflowSuspended,
)
from tests.unit.scripted import (
    DEFAULT,
    EPOCH,
    KEY0,
    KEY1,
    SERIALIZER,
    T0,
    WORKFLOW_ID,
    Raise,
    Script,
    Then,
    after_one_step,
    approval_row,
    charge_card,
    done,
    effect_def,
    effect_row,
    fails_once,
    fingerprint,
    held,
    make_run,
    refund,
    run_effect,
)

# -- a fresh effect -------------------------------------------------------------------------


def test_fresh_effect_writes_ahead_calls_then_settles_with_its_record() -> None:
    script = Script()
    result = run_effect(make_run(), script)
    assert result == {"charged": 500, "key": KEY0}
    assert script.labels == [
        "Execute effect_intent",
        "Call charge_card",
        "Execute settle_effect",
    ]
    assert script.only("effect_intent") == {
        "workflow_id": WORKFLOW_ID,
        "idempotency_key": KEY0,
        "epoch": EPOCH,
        "step_seq": 0,
        "effect_name": "charge_card",
        "params_fingerprint": fingerprint(500),
    }
    call = script.ops[1]
    assert (call.args, call.kwargs) == ((500,), {"idempotency_key": KEY0})
    result_text = SERIALIZER.dumps({"charged": 500, "key": KEY0})
    assert script.only("settle_effect") == {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "idempotency_key": KEY0,
        "status": "applied",
        "result": result_text,
        "error": None,
        "reconciled": False,
        "step_seq": 0,
        "step_name": "charge_card",
        "started_at": T0,
    }


def test_intent_refused_with_no_row_is_a_stale_owner() -> None:
    script = Script(statements={"effect_intent": 0})
    with pytest.raises(StaleOwnerError):
        run_effect(make_run(), script)
    assert script.labels == ["Execute effect_intent", "Execute get_effect"]


def test_intent_conflicting_with_a_pending_row_resumes_it() -> None:
    # A crash after intent/pending with nothing journaled: the journal is fresh, the
    # conflict on the key finds the row.
    row = effect_row(EffectStatus.PENDING, fingerprint(500))
    script = Script(statements={"effect_intent": 0, "get_effect": row})
    run_effect(make_run(), script)
    assert script.labels == [
        "Execute effect_intent",
        "Execute get_effect",
        "Execute effect_pending",
        "Call charge_card",
        "Execute settle_effect",
    ]


def test_pending_refused_raises_stale_owner_before_the_call() -> None:
    row = effect_row(EffectStatus.PENDING, fingerprint(500))  # an attempt before a crash
    script = Script(statements={"effect_intent": 0, "get_effect": row, "effect_pending": 0})
    with pytest.raises(StaleOwnerError):
        run_effect(make_run(), script)
    assert not script.of_type(Call)


def test_settle_refused_raises_stale_owner() -> None:
    script = Script(statements={"settle_effect": 0})
    with pytest.raises(StaleOwnerError):
        run_effect(make_run(), script)


def test_a_fresh_journal_does_not_look_the_effect_up() -> None:
    script = Script()
    run_effect(make_run(), script)
    assert script.executed("get_effect") == []


def test_a_journal_with_records_looks_the_effect_up_first() -> None:
    script = Script()
    run_effect(after_one_step(), script)
    assert script.labels[:2] == ["Execute get_effect", "Execute effect_intent"]
    assert script.only("get_effect") == {"workflow_id": WORKFLOW_ID, "idempotency_key": KEY1}
    assert script.ops[0].fetch == "one"


# -- resuming an effect from its ledger row -------------------------------------------------


def test_already_applied_returns_the_stored_result_without_calling() -> None:
    row = effect_row(EffectStatus.APPLIED, fingerprint(500), result={"charged": 500})
    script = Script(statements={"get_effect": row})
    assert run_effect(after_one_step(), script) == {"charged": 500}
    assert script.labels == ["Execute get_effect", "Execute record_step"]
    record = script.only("record_step")
    assert (record["step_seq"], record["kind"], record["output"]) == (1, "effect", row["result"])


def test_already_failed_records_and_reraises_the_error() -> None:
    row = effect_row(EffectStatus.FAILED, fingerprint(500), error=ValueError("card declined"))
    script = Script(statements={"get_effect": row})
    with pytest.raises(ValueError, match="card declined"):
        run_effect(after_one_step(), script)
    assert script.labels == ["Execute get_effect", "Execute record_step"]
    record = script.only("record_step")
    assert (record["output"], record["error"]) == (None, row["error"])


def test_pending_with_reconcile_adopts_the_outside_worlds_answer() -> None:
    asked: list[tuple[Any, ...]] = []

    def lookup(key: str, cents: int) -> dict[str, Any]:
        asked.append((key, cents))
        return {"found": cents}

    defn = effect_def(charge_card, reconcile=lookup)
    row = effect_row(EffectStatus.PENDING, fingerprint(500))
    script = Script(statements={"get_effect": row})
    assert run_effect(after_one_step(), script, defn) == {"found": 500}
    assert asked == [(KEY1, 500)]
    assert script.labels == [
        "Execute get_effect",
        "Call lookup",
        "Execute settle_effect",
    ]
    settle = script.only("settle_effect")
    assert (settle["status"], settle["reconciled"]) == ("applied", True)
    assert settle["result"] == '{"found":500}'


def test_pending_with_reconcile_finding_nothing_calls_again_with_the_same_key() -> None:
    defn = effect_def(charge_card, reconcile=lambda key, cents: None)
    row = effect_row(EffectStatus.PENDING, fingerprint(500))
    script = Script(statements={"get_effect": row})
    assert run_effect(after_one_step(), script, defn) == {"charged": 500, "key": KEY1}
    assert script.labels == [
        "Execute get_effect",
        "Call <lambda>",
        "Execute effect_pending",
        "Call charge_card",
        "Execute settle_effect",
    ]
    assert script.only("settle_effect")["reconciled"] is False


def test_a_failing_reconcile_raises_and_settles_nothing() -> None:
    def lookup(key: str, cents: int) -> None:
        raise ConnectionError("vendor down")

    defn = effect_def(charge_card, reconcile=lookup)
    row = effect_row(EffectStatus.PENDING, fingerprint(500))
    script = Script(statements={"get_effect": row})
    with pytest.raises(ConnectionError):
        run_effect(after_one_step(), script, defn)
    assert script.labels == ["Execute get_effect", "Call lookup"]


def test_an_intent_row_is_called_without_reconciling() -> None:
    defn = effect_def(charge_card, reconcile=lambda key, cents: {"never": True})
    row = effect_row(EffectStatus.INTENT, fingerprint(500))
    script = Script(statements={"get_effect": row})
    run_effect(after_one_step(), script, defn)
    assert [op.fn for op in script.of_type(Call)] == [charge_card]


def test_a_key_reused_with_other_parameters_is_refused() -> None:
    row = effect_row(EffectStatus.APPLIED, fingerprint(999), result={"charged": 999})
    script = Script(statements={"get_effect": row})
    with pytest.raises(IdempotencyKeyReusedError) as info:
        run_effect(after_one_step(), script)
    assert info.value.key == KEY1
    assert info.value.recorded_fingerprint == fingerprint(999)
    assert info.value.current_fingerprint == fingerprint(500)
    assert script.labels == ["Execute get_effect"]


# -- user keys ------------------------------------------------------------------------------


def test_user_key_is_scoped_to_the_workflow_and_always_looked_up() -> None:
    defn = effect_def(charge_card, key=lambda cents: f"order-{cents}")
    script = Script()
    run_effect(make_run(), script, defn)
    key = f"{WORKFLOW_ID}:order-500"
    assert script.labels[:2] == ["Execute get_effect", "Execute effect_intent"]
    assert script.only("get_effect")["idempotency_key"] == key
    assert script.only("effect_intent")["step_seq"] == 0
    assert script.of_type(Call)[0].kwargs == {"idempotency_key": key}


def test_user_key_applied_at_an_earlier_position_is_not_called_again() -> None:
    defn = effect_def(charge_card, key=lambda cents: "once")
    row = effect_row(EffectStatus.APPLIED, fingerprint(500), result={"charged": 1})
    script = Script(statements={"get_effect": row})
    assert run_effect(after_one_step(), script, defn) == {"charged": 1}
    assert not script.of_type(Call)


# -- failures and retries -------------------------------------------------------------------


def test_a_failing_effect_settles_failed_and_raises() -> None:
    def declined(cents: int, *, idempotency_key: str) -> None:
        raise ValueError("declined")

    script = Script()
    with pytest.raises(ValueError, match="declined"):
        run_effect(make_run(), script, effect_def(declined))
    settle = script.only("settle_effect")
    assert (settle["status"], settle["result"]) == ("failed", None)
    assert decode_error(settle["error"])[:2] == ("builtins.ValueError", "declined")
    assert settle["step_name"] == "declined"  # journaled in the same statement


def test_a_retried_effect_pauses_then_marks_pending_again() -> None:
    calls: list[str] = []
    defn = effect_def(fails_once(calls), retry=RetryPolicy(retries=2, initial_delay=0.5, jitter=0))
    script = Script()
    assert run_effect(make_run(), script, defn) == "ok"
    assert script.labels == [
        "Execute effect_intent",
        "Call flaky",
        "Pause 0.5",
        "Execute effect_pending",
        "Call flaky",
        "Execute settle_effect",
    ]
    assert calls == [KEY0, KEY0]
    assert isinstance(script.ops[2], Pause)


# -- around the effect ----------------------------------------------------------------------


def test_a_replayed_effect_returns_its_record_and_registers_its_undo() -> None:
    run = make_run(
        records=[done(0, "charge_card", {"paid": 1}, StepKind.EFFECT)],
        compensation_of=lambda name: refund if name == "charge_card" else None,
    )
    script = Script()
    assert run_effect(run, script) == {"paid": 1}
    assert script.ops == []
    assert run.compensations == [Compensation(refund, (500,), {}, WORKFLOW_ID, 0)]


def test_a_replayed_effect_a_fork_copied_registers_its_undo_on_the_originals_ledger() -> None:
    copied = dataclasses.replace(
        done(0, "charge_card", {"paid": 1}, StepKind.EFFECT), applied_in="original"
    )
    run = make_run(records=[copied], compensation_of=lambda name: refund)
    run_effect(run, Script())
    assert run.compensations == [Compensation(refund, (500,), {}, "original", 0)]


def test_an_applied_effect_registers_its_undo() -> None:
    run = make_run(compensation_of=lambda name: refund)
    run_effect(run, Script())
    assert run.compensations == [Compensation(refund, (500,), {}, WORKFLOW_ID, 0)]


def test_a_failed_effect_registers_no_undo() -> None:
    def declined(cents: int, *, idempotency_key: str) -> None:
        raise ValueError("declined")

    run = make_run(compensation_of=lambda name: refund)
    with pytest.raises(ValueError):
        run_effect(run, Script(), effect_def(declined, "charge_card"))
    assert run.compensations == []


def test_cancel_interrupts_an_effect_before_its_intent() -> None:
    script = Script()
    with pytest.raises(WorkflowInterrupted):
        run_effect(make_run(cancel="stop"), script)
    assert script.ops == []


def test_an_effect_in_exit_mode_writes_the_pending_records_first() -> None:
    run = make_run(mode="exit")
    run.pending.append(held(0, "earlier"))
    run.journal.next_seq = 1
    script = Script()
    run_effect(run, script)
    assert script.labels[0] == "WriteSteps 1"
    assert script.labels[1] == "Execute effect_intent"
    assert run.pending == []


# -- requires_approval: the gate comes first ------------------------------------------------


def test_an_effect_that_requires_approval_asks_and_suspends() -> None:
    defn = effect_def(charge_card, requires_approval=True)
    run = make_run()
    script = Script()
    with pytest.raises(WorkflowSuspended):
        run_effect(run, script, defn)
    assert script.labels == [
        "Execute get_approval",
        "Execute approval_request",
        "Park",
        "Execute suspend_for_approval",
        "Execute wake_if_decided",
    ]
    request = script.only("approval_request")
    assert request["name"] == "charge_card#0"
    assert request["step_seq"] == 0
    assert request["payload"] == '{"args":[500]}'
    assert run.approvals_asked == {"charge_card": 1}


def test_an_approved_effect_runs_at_the_next_position() -> None:
    defn = effect_def(charge_card, requires_approval=True)
    script = Script(
        statements={
            "get_approval": approval_row("approved", decided_by="ann"),
        }
    )
    assert run_effect(make_run(), script, defn) == {"charged": 500, "key": KEY1}
    assert script.labels == [
        "Execute get_approval",
        "Execute record_step",  # the decision, journaled at position 0
        # The journal loaded was empty, so the effect is not looked up first.
        "Execute effect_intent",
        "Call charge_card",
        "Execute settle_effect",
    ]
    assert script.executed("record_step")[0]["step_name"] == "approval:charge_card#0"


def test_a_denied_effect_is_not_called() -> None:
    defn = effect_def(charge_card, requires_approval=True)
    script = Script(statements={"get_approval": approval_row("denied", comment="too much")})
    with pytest.raises(ApprovalDeniedError) as info:
        run_effect(make_run(), script, defn)
    assert (info.value.effect_name, info.value.comment) == ("charge_card", "too much")
    assert script.labels == ["Execute get_approval", "Execute record_step"]


def test_a_replayed_denial_raises_without_asking() -> None:
    decision = {"approved": False, "comment": "no", "decided_by": "bob", "timed_out": False}
    run = make_run(records=[done(0, "approval:charge_card#0", decision, StepKind.APPROVAL)])
    script = Script()
    with pytest.raises(ApprovalDeniedError):
        run_effect(run, script, effect_def(charge_card, requires_approval=True))
    assert script.ops == []


def test_each_call_of_an_effect_asks_its_own_gate() -> None:
    defn = effect_def(charge_card, requires_approval=True)
    run = make_run()
    approved = approval_row("approved")
    run_effect(run, Script(statements={"get_approval": approved}), defn)
    script = Script(statements={"get_approval": Then(None), "suspend_for_approval": 1})
    with pytest.raises(WorkflowSuspended):
        run_effect(run, script, defn)
    assert script.only("approval_request")["name"] == "charge_card#1"
    assert script.only("approval_request")["step_seq"] == 2


def test_a_scripted_raise_is_thrown_into_the_effect() -> None:
    # The driver failing to perform an operation (here the database going away at the
    # settle) reaches the caller unchanged.
    def answer(op: Any) -> Any:
        if isinstance(op, Execute) and op.name == "settle_effect":
            return Raise(ConnectionResetError("gone"))
        return DEFAULT

    script = Script(answer)
    with pytest.raises(ConnectionResetError):
        run_effect(make_run(), script)
    assert script.labels[-1] == "Execute settle_effect"
    assert not any(isinstance(op, Execute) and op.name == "record_step" for op in script.ops)
