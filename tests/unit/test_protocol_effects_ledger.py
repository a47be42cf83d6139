"""@effect in the pure core, what the ledger row and the journal record say exactly: the
record written for a row found applied or failed, the scope of each attempt, the crash
points in order, the settling of a reconciled call, the undo of a call made here or
elsewhere, the key refused for another effect, the budget gate before the intent, and the
pending call settled first when the run is asked to stop."""

from __future__ import annotations

from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import EffectStatus, RetryPolicy, StepKind
from durable._core import Call, Compensation
from durable._core.ops import StepScope
from durable.errors import (
    BudgetExceededError,
    IdempotencyKeyReusedError,
    StepError,
    WorkflowInterrupted,
    WorkflowSuspended,
)
from tests.unit.scripted import (
    EPOCH,
    KEY0,
    KEY1,
    SERIALIZER,
    T0,
    WORKFLOW_ID,
    Script,
    Then,
    after_one_step,
    approval_row,
    charge_card,
    effect_def,
    effect_row,
    fails_once,
    fingerprint,
    ledger,
    make_run,
    refund,
    run_effect,
)


class CardDeclined(Exception):
    """Not a built-in: a replay raises it as a StepError naming the effect."""


def effect_record(output: str | None, error: str | None, seq: int = 1) -> dict[str, Any]:
    return {
        "workflow_id": WORKFLOW_ID,
        "epoch": EPOCH,
        "step_seq": seq,
        "step_name": "charge_card",
        "kind": StepKind.EFFECT.value,
        "output": output,
        "error": error,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": T0,
    }


def test_a_row_found_applied_is_journaled_as_this_effects_call() -> None:
    row = effect_row(EffectStatus.APPLIED, fingerprint(500), result={"charged": 500})
    script = Script(statements={"get_effect": row})
    run_effect(after_one_step(), script)
    assert script.only("record_step") == effect_record(row["result"], None)


def test_a_row_found_failed_is_journaled_and_raised_under_the_effects_name() -> None:
    row = effect_row(EffectStatus.FAILED, fingerprint(500), error=CardDeclined("no funds"))
    script = Script(statements={"get_effect": row})
    with pytest.raises(StepError) as caught:
        run_effect(after_one_step(), script)
    assert caught.value.step_name == "charge_card"
    assert caught.value.error_message == "no funds"
    assert script.only("record_step") == effect_record(None, row["error"])


def test_each_attempt_runs_in_the_effects_scope() -> None:
    calls: list[str] = []
    defn = effect_def(fails_once(calls), retry=RetryPolicy(retries=1, initial_delay=0.1, jitter=0))
    script = Script()
    run_effect(make_run(), script, defn)
    scopes = [op.scope for op in script.of_type(Call)]
    assert scopes == [
        StepScope("flaky", seq=0, kind="effect", attempt=1),
        StepScope("flaky", seq=0, kind="effect", attempt=2),
    ]
    # The second attempt is marked pending under the run's epoch, by its key.
    assert script.only("effect_pending") == {
        "workflow_id": WORKFLOW_ID,
        "idempotency_key": KEY0,
        "epoch": EPOCH,
    }


def test_the_crash_points_come_in_the_order_of_the_writes() -> None:
    points: list[str] = []
    run_effect(make_run(crash_point=points.append), Script())
    assert points == [
        "effect_after_intent",
        "effect_after_pending",
        "effect_after_call",
        "effect_after_applied",
    ]


def test_a_failed_call_is_settled_failed_as_this_run_saw_it() -> None:
    def declined(cents: int, *, idempotency_key: str) -> None:
        raise ValueError("declined")

    script = Script()
    with pytest.raises(ValueError):
        run_effect(make_run(), script, effect_def(declined, "charge_card"))
    settle = script.only("settle_effect")
    assert settle["reconciled"] is False and settle["step_seq"] == 0
    assert settle["idempotency_key"] == KEY0 and settle["started_at"] == T0


def test_a_reconciled_call_is_settled_at_its_position_and_its_undo_registered() -> None:
    defn = effect_def(charge_card, reconcile=lambda key, cents: {"found": cents})
    row = effect_row(EffectStatus.PENDING, fingerprint(500))
    run = after_one_step(compensation_of=lambda name: refund)
    script = Script(statements={"get_effect": row})
    assert run_effect(run, script, defn) == {"found": 500}
    settle = script.only("settle_effect")
    assert settle["step_seq"] == 1 and settle["idempotency_key"] == KEY1
    assert settle["started_at"] == T0 and settle["step_name"] == "charge_card"
    assert run.compensations == [Compensation(refund, (500,), {}, WORKFLOW_ID, 1)]


def test_a_key_applied_at_another_position_registers_no_second_undo() -> None:
    defn = effect_def(charge_card, key=lambda cents: "once")
    elsewhere = effect_row(EffectStatus.APPLIED, fingerprint(500), result={"c": 1}, step_seq=0)
    run = after_one_step(compensation_of=lambda name: refund)
    run_effect(run, Script(statements={"get_effect": elsewhere}), defn)
    assert run.compensations == []


def test_a_key_applied_at_this_position_registers_its_undo() -> None:
    defn = effect_def(charge_card, key=lambda cents: "once")
    here = effect_row(EffectStatus.APPLIED, fingerprint(500), result={"c": 1}, step_seq=1)
    run = after_one_step(compensation_of=lambda name: refund)
    assert run_effect(run, Script(statements={"get_effect": here}), defn) == {"c": 1}
    assert run.compensations == [Compensation(refund, (500,), {}, WORKFLOW_ID, 1)]


def test_a_key_used_by_another_effect_is_refused_naming_both() -> None:
    row = effect_row(EffectStatus.APPLIED, fingerprint(500), name="send_email")
    script = Script(statements={"get_effect": row})
    with pytest.raises(IdempotencyKeyReusedError) as caught:
        run_effect(after_one_step(), script)
    assert caught.value.key == KEY1
    assert caught.value.recorded_fingerprint == f"send_email:{fingerprint(500)}"
    assert caught.value.current_fingerprint == "charge_card"


def test_a_user_key_is_made_of_the_effects_arguments() -> None:
    def pay(cents: int, *, currency: str, idempotency_key: str) -> int:
        return cents

    defn = effect_def(pay, key=lambda cents, currency: f"{currency}-{cents}")
    script = Script()
    script.run(protocol.effect(make_run(), defn, (5,), {"currency": "eur"}))
    assert script.only("get_effect")["idempotency_key"] == f"{WORKFLOW_ID}:eur-5"


def test_an_effect_over_budget_waits_at_its_positions_gate_before_its_intent() -> None:
    run = after_one_step(budget_id=WORKFLOW_ID, ledger=ledger(limit_steps=1, spent_steps=1))
    script = Script(statements={"get_approval": Then(None, None)})
    with pytest.raises(WorkflowSuspended):
        run_effect(run, script)
    assert script.executed("effect_intent") == []
    assert script.only("denied_budget_gate")["name"] == protocol.budget.labels.budget_gate(1)
    asked = script.only("approval_request")
    assert asked["step_seq"] == 1 and SERIALIZER.loads(asked["payload"])["step"] == "charge_card"


def test_an_effect_whose_budget_gate_was_denied_is_not_called() -> None:
    run = after_one_step(budget_id=WORKFLOW_ID, ledger=ledger(limit_steps=1, spent_steps=1))
    script = Script(statements={"denied_budget_gate": approval_row("denied", comment="no")})
    with pytest.raises(BudgetExceededError) as caught:
        run_effect(run, script)
    assert caught.value.step_name == "charge_card"
    assert script.of_type(Call) == []


# -- asked to stop where a call may have been in flight --------------------------------------


def test_a_pending_call_is_settled_and_its_undo_registered_before_stopping() -> None:
    row = effect_row(EffectStatus.PENDING, fingerprint(500))
    run = after_one_step(cancel="stop", compensation_of=lambda name: refund)
    script = Script(statements={"get_effect": row})
    with pytest.raises(WorkflowInterrupted):
        run_effect(run, script)
    assert script.executed("get_effect")[0] == {
        "workflow_id": WORKFLOW_ID,
        "idempotency_key": KEY1,
    }
    assert [op.fn for op in script.of_type(Call)] == [charge_card]
    assert script.only("settle_effect")["status"] == "applied"
    assert run.compensations == [Compensation(refund, (500,), {}, WORKFLOW_ID, 1)]


def test_a_call_not_pending_is_left_alone_when_stopping() -> None:
    for row in (None, effect_row(EffectStatus.APPLIED, fingerprint(500), result={"c": 1})):
        run = after_one_step(cancel="stop", compensation_of=lambda name: refund)
        script = Script(statements={"get_effect": row})
        with pytest.raises(WorkflowInterrupted):
            run_effect(run, script)
        assert script.labels == ["Execute get_effect"]
        assert run.compensations == []


def test_a_first_run_asked_to_stop_looks_nothing_up() -> None:
    script = Script()
    with pytest.raises(WorkflowInterrupted):
        run_effect(make_run(cancel="stop"), script)
    assert script.labels == []
