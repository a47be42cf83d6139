"""What an attempt that no longer counts spends: a def step's attempt given up by its
timeout keeps running in its thread, and the call it made was paid for. Its charge is
not the step's (the step may have recorded already): it is written to the budget's ledger
on its own, keyed so that a resend adds it once, and the run's next cap check counts it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from durable import _core as protocol
from durable.errors import BudgetExceededError, StaleOwnerError
from tests.unit.scripted import EPOCH, WORKFLOW_ID, Script, ledger, ledger_row, make_run


def _budgeted(**row: object) -> protocol.Run:
    return make_run(budget_id=WORKFLOW_ID, ledger=ledger(**row))


def _scope(live: int | None = 2) -> protocol.StepScope:
    return protocol.StepScope("ask_model", charging=True, seq=4, live=live)


def test_a_live_attempts_charge_is_the_steps() -> None:
    run, scope = _budgeted(limit_dollars="1"), _scope()
    assert protocol.charge(run, scope, Decimal("0.5"), 10, 2) is None
    assert protocol.charge(run, scope, Decimal("0.25"), 0) is None  # the step's own thread
    assert (scope.dollars, scope.tokens) == (Decimal("0.75"), 10)


@pytest.mark.parametrize(
    ("live", "attempt"),
    [
        (2, 1),  # attempt 1 was given up; attempt 2 runs
        (None, 1),  # given up, the next not begun (or the step recorded)
        (None, None),  # code the step started, charging after the step ended
    ],
)
def test_a_charge_of_an_attempt_that_no_longer_counts_is_late(
    live: int | None, attempt: int | None
) -> None:
    run, scope = _budgeted(limit_dollars="1", spent_dollars="0.9"), _scope(live)
    # Past the cap, and not refused: the call was made and paid for.
    first = protocol.charge(run, scope, Decimal("0.5"), 7, attempt)
    second = protocol.charge(run, scope, Decimal("0.5"), 7, attempt)
    assert first is not None and second is not None
    assert (first.dollars, first.tokens) == (Decimal("0.5"), 7)
    assert first.key != second.key  # two charges, two keys
    assert f"{EPOCH}:4:" in first.key  # the run's epoch and the step's position
    assert (scope.dollars, scope.tokens, scope.refused) == (Decimal(0), 0, None)


def test_a_late_charge_of_nothing_writes_nothing() -> None:
    assert protocol.charge(_budgeted(), _scope(None), Decimal(0), 0) is None


def test_a_late_charge_is_written_apart_and_the_next_cap_check_counts_it() -> None:
    run, scope = _budgeted(limit_dollars="1", spent_dollars="0.5"), _scope(None)
    late = protocol.charge(run, scope, Decimal("0.5"), 0, 1)
    assert late is not None
    script = Script(
        statements={"add_late_charge": ledger_row(limit_dollars="1", spent_dollars="1")}
    )
    script.run(protocol.write_late_charge(run, scope, late))
    assert script.only("add_late_charge") == {
        "workflow_id": WORKFLOW_ID,
        "charge_key": late.key,
        "step_seq": 4,
        "budget_id": WORKFLOW_ID,
        "dollars": Decimal("0.5"),
        "tokens": 0,
    }
    assert run.ledger is not None and run.ledger.spent_dollars == Decimal(1)
    # The live attempt (or the next step) is refused by the cap it now meets.
    live = _scope(3)
    with pytest.raises(BudgetExceededError):
        protocol.charge(run, live, Decimal("0.01"), 0, 3)
    assert protocol.with_running_steps(run).exhausted(run.settings.clock.now()) is not None


def test_a_late_charge_sent_again_that_added_nothing_changes_nothing() -> None:
    # Its key was taken (the first send landed, its answer lost): no row comes back.
    run, scope = _budgeted(limit_dollars="1", spent_dollars="0.5"), _scope(None)
    late = protocol.charge(run, scope, Decimal("0.5"), 0, 1)
    assert late is not None
    Script(statements={"add_late_charge": None}).run(protocol.write_late_charge(run, scope, late))
    assert run.ledger == ledger(limit_dollars="1", spent_dollars="0.5")


def test_a_ledger_row_older_than_the_runs_copy_is_not_taken() -> None:
    # A late charge's answer and the run's own record's answer arrive in any order.
    run = _budgeted(limit_dollars="5", spent_dollars="1.5", spent_steps=3)
    protocol.adopt_ledger(run, ledger(limit_dollars="5", spent_dollars="1", spent_steps=3))
    assert run.ledger is not None and run.ledger.spent_dollars == Decimal("1.5")
    protocol.adopt_ledger(run, ledger(limit_dollars="5", spent_dollars="1.5", spent_steps=4))
    assert run.ledger.spent_steps == 4
    raised = ledger(limit_dollars="9", spent_dollars="1.5", spent_steps=4)
    protocol.adopt_ledger(run, raised)  # as new, with its limit raised
    assert run.ledger == raised


def test_an_attempt_that_no_longer_counts_may_not_reserve_nor_send_a_model_call() -> None:
    run, scope = _budgeted(limit_dollars="10"), _scope(2)
    with pytest.raises(StaleOwnerError):
        protocol.reserve(run, scope, Decimal("0.1"), 0, 1)
    rates = (Decimal(1), Decimal(1))
    with pytest.raises(StaleOwnerError):
        protocol.reserve_call(run, scope, 10, 10, rates, "max_tokens", 1)
    assert (scope.reserved_dollars, scope.reserved_tokens) == (Decimal(0), 0)
    protocol.reserve(run, scope, Decimal("0.1"), 0, 2)  # the live one may
    assert scope.reserved_dollars == Decimal("0.1")


def test_a_model_call_settled_late_is_a_late_charge() -> None:
    run, scope = _budgeted(limit_dollars="1"), _scope(None)
    late = protocol.settle(run, scope, Decimal("0.3"), 300, 1)
    assert late is not None and (late.dollars, late.tokens) == (Decimal("0.3"), 300)
    assert scope.dollars == Decimal(0)
    live = _scope(1)
    assert protocol.settle(run, live, Decimal("0.3"), 300, 1) is None
    assert live.dollars == Decimal("0.3")
