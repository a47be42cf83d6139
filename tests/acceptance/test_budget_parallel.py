"""The budget cap holds for an async agent whose steps run in parallel (asyncio.gather),
run by a real `durable worker`: the ledger never records more than the limit, the steps
past it wait at the budget gate instead of running (or instead of being recorded), and a
denial ends the workflow with nothing more spent. What reached the vendor is counted in the
world (`vendor_calls`), not read from the ledger."""

from __future__ import annotations

from decimal import Decimal

import psycopg
import pytest

import durable
from durable import errors
from tests.acceptance.workers import scalar, start_worker, stop_worker, wait_for
from tests.apps import budget_app

APP = "tests.apps.budget_app"


def _vendor_calls(url: str, workflow_id: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM vendor_calls WHERE workflow_id = %s", workflow_id))  # type: ignore[arg-type]


def _spent(url: str, workflow_id: str) -> tuple[Decimal, int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT spent_dollars, spent_tokens, spent_steps FROM durable.budgets"
            " WHERE budget_id = %s",
            [workflow_id],
        ).fetchone()
    assert row is not None
    return Decimal(row[0]), int(row[1]), int(row[2])


@pytest.mark.parametrize(
    ("workflow", "how"),
    [
        ("fan_dollars", "charge"),
        ("fan_dollars", "reserve"),
        ("fan_tokens", "charge"),
        ("fan_steps", "plain"),
    ],
)
def test_six_parallel_steps_never_pass_a_cap_that_has_room_for_three(
    database_url: str, subprocess_env: dict[str, str], workflow: str, how: str
) -> None:
    budget_app.setup(database_url)
    workflow_id = f"{workflow}-{how}"
    worker = start_worker(subprocess_env, database_url, app=APP, concurrency=2)
    try:
        with durable.Engine(database_url, registry=budget_app.registry, worker=False) as engine:
            fn = getattr(budget_app, workflow)
            engine.submit(fn, workflow_id, 6, how, workflow_id=workflow_id)
            wait_for(
                lambda: (
                    engine.get_workflow(workflow_id).status in ("SUSPENDED", "SUCCESS", "ERROR")
                ),
                what="the workflow to stop at the cap",
            )
            status = engine.get_workflow(workflow_id).status
            dollars, tokens, steps = _spent(database_url, workflow_id)
            # Three steps fit: they are recorded, the others wait at a gate.
            assert status == "SUSPENDED", (status, dollars, tokens, steps)
            assert steps == 3
            assert dollars <= Decimal("1.0") and tokens <= 300
            if how == "charge":
                assert (dollars, tokens) in ((Decimal("0.9"), 300), (Decimal(0), 300))
            if how in ("reserve", "plain"):
                # Refused before the call: the vendor saw exactly the calls recorded.
                assert _vendor_calls(database_url, workflow_id) == 3
            gates = [g["name"] for g in engine.list_approvals(workflow_id)]
            assert gates and all(g.startswith("budget@") for g in gates)
            # Each branch past the cap asks its own gate; one that had not reached its gate
            # when the workflow parked asks it on the next run: it is denied too.
            with pytest.raises(errors.WorkflowFailedError) as info:
                for _ in range(60):
                    for gate in engine.list_approvals(workflow_id):
                        assert gate["name"].startswith("budget@")
                        engine.decide(workflow_id, gate["name"], False, comment="stop here")
                    try:
                        engine.retrieve(workflow_id).result(timeout=1)
                    except errors.ResultTimeoutError:
                        continue
            assert info.value.error_type.endswith("BudgetExceededError")
            assert _spent(database_url, workflow_id) == (dollars, tokens, steps)
    finally:
        stop_worker(worker)


@pytest.mark.parametrize("how", ["sleep", "recv", "approval"])
def test_a_branch_that_parks_the_workflow_waits_for_its_running_sibling(
    database_url: str, subprocess_env: dict[str, str], how: str
) -> None:
    """A branch waits durably while its sibling is inside a 1.5 s vendor call: the
    workflow is parked only once that call is recorded, so the resumed run replays it
    instead of calling the vendor again."""
    budget_app.setup(database_url)
    workflow_id = f"park-{how}"
    worker = start_worker(subprocess_env, database_url, app=APP, concurrency=2)
    try:
        with durable.Engine(database_url, registry=budget_app.registry, worker=False) as engine:
            engine.submit(budget_app.call_while_waiting, workflow_id, how, workflow_id=workflow_id)
            wait_for(
                lambda: engine.get_workflow(workflow_id).status == "SUSPENDED",
                what="the workflow to park",
            )
            # Parked after the sibling's call was journaled, not during it.
            assert [s.step_name for s in engine.steps(workflow_id) if s.kind == "step"] == [
                "tests.apps.budget_app.slow_call"
            ] or any(s.step_name.endswith("slow_call") for s in engine.steps(workflow_id))
            assert _vendor_calls(database_url, workflow_id) == 1
            if how == "recv":
                engine.send(workflow_id, "now", topic="go")
            elif how == "approval":
                engine.decide(workflow_id, "ship", True)
            result = engine.retrieve(workflow_id).result(timeout=60)
            expected = {"sleep": "slept", "recv": "now", "approval": "approved"}[how]
            assert result == [0, expected]
            assert _vendor_calls(database_url, workflow_id) == 1  # once, across the park
    finally:
        stop_worker(worker)
