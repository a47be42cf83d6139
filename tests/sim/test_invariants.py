"""Each invariant of the simulation flags the violation it is for: a check that could
never fail would make every seed pass. (Database-free: the facts are planted.)"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from typing import Any

from tests.sim import invariants
from tests.sim.world import Vendor


def facts(**tables: Any) -> invariants.Facts:
    f = invariants.Facts.__new__(invariants.Facts)
    f.workflows = {}
    f.steps, f.effects, f.messages, f.app_rows, f.approvals = [], [], [], [], []
    f.app_records = []
    f.budgets = {}
    for name, value in tables.items():
        setattr(f, name, value)
    return f


def wf(wid: str, status: str = "SUCCESS", **more: Any) -> dict[str, Any]:
    row = {
        "workflow_id": wid,
        "status": status,
        "parent_id": None,
        "parent_step_seq": None,
        "budget_id": None,
        "error": None,
        "owner": None,
        "lease_expires_at": None,
        "wake_at": None,
    }
    row.update(more)
    return row


def paid(vendor: Vendor, key: str, tag: str, times: int = 1) -> None:
    for _ in range(times):
        vendor.payments[key] += 1
        vendor.paid_tags[key] = tag


def test_a_payment_charged_twice_is_flagged() -> None:
    v = Vendor()
    paid(v, "w0:1", "w0.1", times=2)
    assert invariants.effects_once(v, facts()) == ["payment key w0:1 charged 2 times"]
    paid(v, "w1:1", "w1.1")
    assert len(invariants.effects_once(v, facts())) == 1


def test_more_refunds_than_payments_of_an_instruction_are_flagged() -> None:
    v = Vendor()
    paid(v, "w0:1", "w0.1")
    v.refunds.update({"w0:3": 1, "w0f2:4": 1})
    v.refund_tags.update({"w0:3": "w0.1", "w0f2:4": "w0.1"})
    assert invariants.undone_once(v, facts()) == ["w0.1: refunded 2 times, paid 1 times"]


def test_a_compensated_lineage_that_kept_money_is_flagged() -> None:
    v = Vendor()
    paid(v, "w0:1", "w0.1")
    f = facts(workflows={"w0": wf("w0", "COMPENSATED")})
    assert invariants.compensated_net_zero(v, f) != []
    v.refunds["w0:3"] = 1
    v.refund_tags["w0:3"] = "w0.1"
    assert invariants.compensated_net_zero(v, f) == []
    # A fork holding the payment that succeeded: the payment stays, rightly.
    f.workflows["w0f1"] = wf("w0f1", "SUCCESS")
    v.refunds.clear()
    assert invariants.compensated_net_zero(v, f) == []


def test_an_application_row_without_its_journal_row_and_twice_are_flagged() -> None:
    steps = [
        {
            "step_name": "book",
            "output": json.dumps("w0/w0.1"),
            "workflow_id": "w0",
            "step_seq": 1,
            "child_workflow_id": None,
        }
    ]
    rows = [{"workflow_id": "w0", "tag": "w0.1"}]
    assert invariants.transactions_exactly_once(Vendor(), facts(steps=steps, app_rows=rows)) == []
    twice = invariants.transactions_exactly_once(Vendor(), facts(steps=steps, app_rows=rows * 2))
    assert twice == ["application row w0/w0.1 written 2 times"]
    orphan = invariants.transactions_exactly_once(Vendor(), facts(app_rows=rows))
    assert orphan == ["application row w0/w0.1 has no journal row"]
    missing = invariants.transactions_exactly_once(Vendor(), facts(steps=steps))
    assert missing == ["journal names application row w0/w0.1, which is missing"]
    # A separate application database's record, committed with the row, of a run cancelled
    # before it replayed the step (so the system journal never adopted it).
    beside = invariants.transactions_exactly_once(Vendor(), facts(app_rows=rows, app_records=steps))
    assert beside == []


def test_an_orphan_child_and_two_children_at_one_position_are_flagged() -> None:
    workflows = {
        "p": wf("p"),
        "c1": wf("c1", parent_id="p", parent_step_seq=0),
        "c2": wf("c2", parent_id="p", parent_step_seq=0),
    }
    steps = [
        {
            "workflow_id": "p",
            "step_seq": 0,
            "child_workflow_id": "c1",
            "step_name": "child",
            "output": None,
        }
    ]
    found = invariants.children_adopted(Vendor(), facts(workflows=workflows, steps=steps))
    assert found == [
        "child c2 (SUCCESS) is not in the journal of its parent p",
        "p@0 started 2 children",
    ]
    # A parent that never got back to the position (cancelled after the crash that cut off
    # its journal row) has not passed its child over.
    alone = {"p": wf("p", "CANCELLED"), "c": wf("c", "CANCELLED", parent_id="p", parent_step_seq=0)}
    assert invariants.children_adopted(Vendor(), facts(workflows=alone)) == []


def test_a_step_run_twice_by_live_processes_is_flagged_unless_one_was_cut() -> None:
    v = Vendor()
    v.calls += [("touch", "w0|w0.1", "p1"), ("touch", "w0|w0.1", "p2")]
    assert invariants.once_unless_cut(v, facts(), set()) != []
    assert invariants.once_unless_cut(v, facts(), {"p1"}) == []


def test_both_branches_of_a_patch_are_flagged() -> None:
    v = Vendor()
    paid(v, "w0:2", "w0.2.old")
    assert invariants.patch_one_branch(v, facts()) == []
    paid(v, "w0:3", "w0.2.new")
    assert invariants.patch_one_branch(v, facts()) == ["w0 took both branches of the patch at w0.2"]
    v2 = Vendor()
    paid(v2, "w0-w0.2.old:0", "w0.2.old.0")  # the old branch's child under its own id
    paid(v2, "w0:3", "w0.2.new")
    assert invariants.patch_one_branch(v2, facts()) != []
    v3 = Vendor()
    paid(v3, "w0:3", "w0.2.new")
    rows = [{"workflow_id": "w0", "tag": "w0.2.old"}]  # the old branch's transaction
    assert invariants.patch_one_branch(v3, facts(app_rows=rows)) != []


def test_an_error_durable_raised_about_itself_is_flagged() -> None:
    own = json.dumps({"type": "tests.sim.app.Boom", "message": "w0.3"})
    odd = json.dumps({"type": "durable.errors.NondeterminismError", "message": "diverged"})
    f = facts(workflows={"a": wf("a", "ERROR", error=own), "b": wf("b", "ERROR", error=odd)})
    assert invariants.expected_outcomes(Vendor(), f) == [
        "b ended ERROR with durable.errors.NondeterminismError: diverged"
    ]
    # A budget used up is the run's outcome only when its gate was denied.
    spent = json.dumps({"type": "durable.errors.BudgetExceededError", "message": "used up"})
    gate = {"workflow_id": "c", "name": "budget", "status": "denied"}
    f = facts(workflows={"c": wf("c", "ERROR", error=spent)}, approvals=[gate])
    assert invariants.expected_outcomes(Vendor(), f) == []
    f = facts(workflows={"c": wf("c", "ERROR", error=spent)})
    assert invariants.expected_outcomes(Vendor(), f) != []


def test_an_unfinished_run_after_the_drain_is_flagged() -> None:
    f = facts(workflows={"a": wf("a", "PENDING"), "b": wf("b", "SUCCESS")})
    (found,) = invariants.nothing_stranded(Vendor(), f)
    assert found.startswith("a left PENDING")


def test_spending_past_the_cap_is_flagged() -> None:
    budget = {"limit_dollars": Decimal("2.0"), "spent_dollars": Decimal("2.6")}
    f = facts(workflows={"w0": wf("w0", budget_id="w0")}, budgets={"w0": budget})
    assert invariants.spending_capped(Vendor(), f, 0) != []
    budget["spent_dollars"] = Decimal("2.0")
    v = Vendor()
    v.models += [("w0", Decimal("0.5"))] * 6  # $3 at the vendor, $2 in the ledger
    assert invariants.spending_capped(v, f, 0) != []
    assert Counter(w for w, _ in v.models) == {"w0": 6}


def test_steps_past_the_limit_are_flagged_beyond_one_per_other_child() -> None:
    budget = {"limit_dollars": None, "limit_steps": 3, "spent_steps": 4}
    f = facts(workflows={"w0": wf("w0", budget_id="w0")}, budgets={"w0": budget})
    (found,) = invariants.spending_capped(Vendor(), f, 0)
    assert "4 steps > limit 3" in found
    f.workflows["w0:child:1"] = wf("w0:child:1", budget_id="w0")
    assert invariants.spending_capped(Vendor(), f, 0) == []
    del f.workflows["w0:child:1"]
    f.approvals = [{"workflow_id": "w0", "name": "budget@3", "status": "approved"}]
    assert invariants.spending_capped(Vendor(), f, 0) == []


def test_a_stopping_worker_that_starts_another_step_is_flagged() -> None:
    v = Vendor()
    v.events += [("touch", "w0", "p1"), ("touch", "w0", "p1"), ("touch", "w1", "p1")]
    v.events += [("touch", "w0", "p2")]
    assert invariants.handed_over_at_a_boundary(v, [("p1", 0)], 1) == [
        "w0: 2 calls by p1 after it was told to stop"
    ]
    assert invariants.handed_over_at_a_boundary(v, [("p1", 0)], 3) == []
    assert invariants.handed_over_at_a_boundary(v, [("p1", 1)], 1) == []
    # An undo under way is not cut short by the stop: its refunds are not new steps.
    v = Vendor()
    v.events += [("pay", "w0", "p1"), ("refund", "w0", "p1"), ("refund", "w0", "p1")]
    assert invariants.handed_over_at_a_boundary(v, [("p1", 0)], 1) == []
    v.events += [("pay", "w0", "p1")]
    assert invariants.handed_over_at_a_boundary(v, [("p1", 0)], 1) == [
        "w0: 2 calls by p1 after it was told to stop"
    ]
