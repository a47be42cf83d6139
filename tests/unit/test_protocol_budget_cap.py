"""The budget's arithmetic and its gates in the pure core: where a limit is passed (a
total equal to the limit is within it), what counts toward it (the ledger, every running
step, the larger of charged and reserved), what a late charge is keyed by, what is left,
and what a step refused by the cap keeps, resets and asks."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from durable import _core as protocol
from durable._base.models import Budget
from durable._core import Call, StepScope
from durable._core.budget import (
    _cap_gate,
    adopt_ledger,
    budget_left,
    open_ledger,
    over_cap,
    release,
    reserve_call,
    settle,
    with_running_steps,
)
from durable.errors import (
    BudgetExceededError,
    StaleOwnerError,
    UnboundedModelCallError,
    WorkflowSuspended,
)
from tests.unit.scripted import (
    EPOCH,
    SERIALIZER,
    WORKFLOW_ID,
    FixedClock,
    Script,
    approval_row,
    ledger,
    ledger_row,
    make_run,
    step_def,
)


def tokens_run(limit: int = 100, spent: int = 60) -> Any:
    return make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_tokens=limit, spent_tokens=spent))


def live(name: str = "llm", **fields: Any) -> StepScope:
    return StepScope(name, charging=True, live=1, seq=4, **fields)


# -- the cap ---------------------------------------------------------------------------------


def test_a_charge_reaching_the_token_limit_exactly_is_within_it() -> None:
    run = tokens_run()
    sibling, scope = live("other", tokens=15), live(tokens=5)
    run.inflight = [sibling, scope]
    assert protocol.charge(run, scope, Decimal(0), 20) is None  # 60 + 15 + 25 = 100
    assert scope.tokens == 25
    with pytest.raises(BudgetExceededError) as caught:
        protocol.charge(run, scope, Decimal(0), 1)
    assert caught.value.exhausted == "tokens: 101 would pass the limit of 100"
    assert (caught.value.workflow_id, caught.value.step_name) == (WORKFLOW_ID, "llm")
    assert scope.tokens == 25 and scope.refused == caught.value.exhausted


def test_a_running_step_counts_the_larger_of_its_charge_and_its_reservation() -> None:
    run = tokens_run()
    sibling = live("other", tokens=5, reserved_tokens=30)
    run.inflight = [sibling]
    assert over_cap(run, live(), tokens=10) is None  # 60 + 30 + 10
    assert over_cap(run, live(), tokens=11) is not None
    assert over_cap(run, live(), reserve_tokens=10) is None
    assert over_cap(run, live(), reserve_tokens=11) is not None
    scope = live(tokens=8, reserved_tokens=4)
    run.inflight = [scope]
    assert over_cap(run, scope, tokens=32) is None  # max(8 + 32, 4) = 40
    assert over_cap(run, scope, reserve_tokens=36) is None  # max(8, 4 + 36) = 40
    assert over_cap(run, scope, reserve_tokens=37) is not None


def test_reservations_add_up_and_release_down_to_nothing() -> None:
    run = tokens_run(limit=1000, spent=0)
    run.ledger = ledger(limit_tokens=1000, limit_dollars="10")
    scope = live()
    protocol.reserve(run, scope, Decimal("0.5"), 10)
    protocol.reserve(run, scope, Decimal("0.25"), 5)
    assert (scope.reserved_dollars, scope.reserved_tokens) == (Decimal("0.75"), 15)
    release(scope, Decimal("0.5"), 10)
    assert (scope.reserved_dollars, scope.reserved_tokens) == (Decimal("0.25"), 5)
    release(scope, Decimal(1), 50)
    assert (scope.reserved_dollars, scope.reserved_tokens) == (Decimal(0), 0)


def test_a_refused_reservation_names_the_step_and_reserves_nothing() -> None:
    run = tokens_run()
    scope = live()
    with pytest.raises(BudgetExceededError) as caught:
        protocol.reserve(run, scope, Decimal(0), 41)
    assert (caught.value.workflow_id, caught.value.step_name) == (WORKFLOW_ID, "llm")
    assert scope.reserved_tokens == 0


def test_a_late_attempt_may_not_reserve() -> None:
    with pytest.raises(StaleOwnerError) as caught:
        protocol.reserve(tokens_run(), live(), Decimal(0), 1, attempt=2)
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)
    with pytest.raises(StaleOwnerError) as caught:
        reserve_call(tokens_run(), live(), 1, 1, None, "max_tokens", attempt=2)
    assert (caught.value.workflow_id, caught.value.epoch) == (WORKFLOW_ID, EPOCH)


def test_late_charges_are_keyed_by_epoch_position_and_count() -> None:
    run, scope = tokens_run(), live()
    first = protocol.charge(run, scope, Decimal("0.1"), 0, attempt=2)
    second = protocol.charge(run, scope, Decimal(0), 3, attempt=2)
    assert first is not None and second is not None
    assert (first.key, second.key) == (f"{EPOCH}:4:1", f"{EPOCH}:4:2")
    assert (second.dollars, second.tokens) == (Decimal(0), 3)
    assert scope.tokens == 0 and scope.dollars == 0  # not the step's


def test_a_settled_call_adds_to_the_steps_charge_past_the_cap() -> None:
    run, scope = tokens_run(), live(tokens=30, dollars=Decimal("0.5"))
    assert settle(run, scope, Decimal("0.25"), 50) is None
    assert (scope.dollars, scope.tokens) == (Decimal("0.75"), 80)


def test_a_call_settled_by_a_late_attempt_is_a_late_charge() -> None:
    run, scope = tokens_run(), live()
    late = settle(run, scope, Decimal(0), 50, attempt=2)
    assert late is not None and late.tokens == 50
    assert scope.tokens == 0


def test_a_token_limited_call_sets_aside_its_worst_case_in_tokens_only() -> None:
    run, scope = tokens_run(limit=1000, spent=0), live()
    assert reserve_call(run, scope, 100, 200, None, "max_tokens", attempt=1) == (Decimal(0), 300)
    assert (scope.reserved_dollars, scope.reserved_tokens) == (Decimal(0), 300)


def test_a_call_without_an_output_bound_is_refused_naming_the_step() -> None:
    with pytest.raises(UnboundedModelCallError) as caught:
        reserve_call(tokens_run(), live(), 100, None, None, "max_tokens")
    assert (caught.value.step_name, caught.value.field) == ("llm", "max_tokens")
    assert caught.value.limit == "token"


# -- the ledger ------------------------------------------------------------------------------


def test_running_steps_count_their_tokens_toward_the_gate() -> None:
    run = tokens_run()
    run.inflight = [live("a", tokens=5), live("b", reserved_tokens=7), StepScope("c", tokens=9)]
    counted = with_running_steps(run)
    assert (counted.spent_tokens, counted.spent_steps) == (72, 2)  # a and b charge, c does not


def test_a_ledger_showing_fewer_steps_than_the_copy_is_older() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(spent_steps=5, spent_tokens=3))
    adopt_ledger(run, ledger(spent_steps=4, spent_tokens=3))
    assert run.ledger is not None and run.ledger.spent_steps == 5
    adopt_ledger(run, ledger(spent_steps=6, spent_tokens=3))
    assert run.ledger.spent_steps == 6


def test_a_budget_that_is_gone_leaves_the_run_without_a_ledger() -> None:
    run = make_run(budget_id="root")
    Script(statements={"get_budget": None}).run(open_ledger(run, None))
    assert run.ledger is None


def test_what_is_left_is_the_limit_less_what_is_spent_never_below_nothing() -> None:
    run = make_run(
        ledger=ledger(
            limit_dollars="1",
            spent_dollars="0.25",
            limit_tokens=100,
            spent_tokens=40,
            limit_steps=10,
            spent_steps=3,
        ),
        clock=FixedClock(),
    )
    left = budget_left(run, live(tokens=10, dollars=Decimal("0.25")))
    assert left == Budget(dollars=0.5, tokens=50, steps=7, seconds=None)
    run.ledger = ledger(
        limit_dollars="1",
        spent_dollars="3",
        limit_tokens=100,
        spent_tokens=400,
        limit_steps=10,
        spent_steps=30,
    )
    assert budget_left(run) == Budget(dollars=0.0, tokens=0, steps=0, seconds=None)
    run.ledger = ledger(spent_steps=3)
    assert budget_left(run) == Budget()


# -- the cap's gate --------------------------------------------------------------------------


@pytest.mark.parametrize(("dollars", "tokens"), [("0.2", 0), ("0", 7)])
def test_what_a_refused_attempt_charged_is_written_apart_and_its_reservation_ended(
    dollars: str, tokens: int
) -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.9"))
    scope = live(dollars=Decimal(dollars), tokens=tokens, reserved_tokens=5)
    scope.reserved_dollars = Decimal("0.1")
    scope.refused = "dollars: too much"
    script = Script(statements={"get_approval": None})
    with pytest.raises(WorkflowSuspended):
        script.run(_cap_gate(run, 4, scope, 2))
    assert script.only("add_late_charge") == {
        "workflow_id": WORKFLOW_ID,
        "charge_key": f"{EPOCH}:4:cap2",
        "step_seq": 4,
        "budget_id": WORKFLOW_ID,
        "dollars": Decimal(dollars),
        "tokens": tokens,
    }
    assert (scope.dollars, scope.tokens, scope.refused) == (Decimal(0), 0, None)
    assert (scope.reserved_dollars, scope.reserved_tokens) == (Decimal(0), 0)
    asked = script.only("approval_request")
    assert asked["name"] == "budget@4:cap2" and asked["step_seq"] == 4
    payload = SERIALIZER.loads(asked["payload"])
    assert payload["step"] == "llm" and payload["exhausted"] == "dollars: too much"


def test_a_refused_attempt_that_charged_nothing_writes_nothing_apart() -> None:
    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_dollars="1", spent_dollars="0.9"))
    script = Script(statements={"get_approval": approval_row("denied")})
    with pytest.raises(BudgetExceededError) as caught:
        script.run(_cap_gate(run, 4, live(), 0))
    assert script.executed("add_late_charge") == []
    assert (caught.value.workflow_id, caught.value.step_name) == (WORKFLOW_ID, "llm")
    assert caught.value.exhausted == "the budget"


def test_a_resumed_step_at_a_denied_gate_without_a_comment_says_denied() -> None:
    def llm() -> str:
        return "ok"

    run = make_run(
        budget_id=WORKFLOW_ID, ledger=ledger(limit_steps=1, spent_steps=1), first_run=False
    )
    script = Script(statements={"denied_budget_gate": {"comment": None}})
    with pytest.raises(BudgetExceededError) as caught:
        script.run(protocol.step(run, step_def(llm), (), {}))
    assert (caught.value.workflow_id, caught.value.step_name) == (WORKFLOW_ID, "llm")
    assert caught.value.exhausted == "denied"
    assert script.only("denied_budget_gate") == {"workflow_id": WORKFLOW_ID, "name": "budget@0"}


def test_a_step_over_budget_asks_at_its_positions_gate_with_what_is_spent() -> None:
    def llm() -> str:
        return "ok"

    run = make_run(budget_id=WORKFLOW_ID, ledger=ledger(limit_steps=2, spent_steps=2))
    script = Script(
        statements={
            "get_budget": ledger_row(limit_steps=2, spent_steps=2),
            "get_approval": approval_row("denied"),
        }
    )
    with pytest.raises(BudgetExceededError) as caught:
        script.run(protocol.step(run, step_def(llm), (), {}))
    assert (caught.value.workflow_id, caught.value.step_name) == (WORKFLOW_ID, "llm")
    assert caught.value.exhausted.startswith("steps")
    assert script.of_type(Call) == []
    assert script.executed("get_budget") == [{"budget_id": WORKFLOW_ID}]
