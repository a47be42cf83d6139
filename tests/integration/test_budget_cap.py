"""The budget is a hard cap: a charge that would pass a limit is refused inside the step,
a reservation that does not fit stops the call before it is made, and a time budget
counts wall-clock time from the first start. Sync and async workflows alike."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durable
from durable import errors


def _wait_status(
    engine: durable.Engine, workflow_id: str, status: str, timeout: float = 20
) -> None:
    deadline = time.monotonic() + timeout
    while engine.get_workflow(workflow_id).status != status:
        assert time.monotonic() < deadline, engine.get_workflow(workflow_id)
        time.sleep(0.05)


def cap_app(kind: str) -> tuple[durable.Registry, list[str], Any]:
    """Steps charging $0.30 each under a $1.00 budget; `vendor` records every call."""
    reg = durable.Registry()
    vendor: list[str] = []

    if kind == "sync":

        @durable.step(registry=reg)
        def think(i: int) -> int:
            vendor.append(f"call{i}")
            durable.charge(dollars=0.3, tokens=10)
            return i

        @durable.workflow(registry=reg, budget=durable.Budget(dollars=1.0))
        def agent(n: int) -> list[int]:
            return [think(i) for i in range(n)]

        return reg, vendor, agent

    @durable.step(registry=reg)
    async def athink(i: int) -> int:
        vendor.append(f"call{i}")
        durable.charge(dollars=0.3, tokens=10)
        return i

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=1.0))
    async def aagent(n: int) -> list[int]:
        return [await athink(i) for i in range(n)]

    return reg, vendor, aagent


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_fourth_charge_is_refused_and_the_workflow_waits_at_the_gate(
    database_url: str, kind: str
) -> None:
    reg, vendor, agent = cap_app(kind)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        engine.start(agent, 6, workflow_id="cap")
        _wait_status(engine, "cap", "SUSPENDED")
        # Steps 1-3 completed; step 4 ran, its charge was refused; nothing after it ran.
        assert vendor == ["call0", "call1", "call2", "call3"]
        ledger = engine.budget("cap")
        assert ledger is not None
        assert ledger["spent"] == {"dollars": 0.9, "tokens": 30, "steps": 3}
        assert [s.step_seq for s in engine.steps("cap")] == [0, 1, 2]  # step 4 not journaled
        (gate,) = engine.list_approvals("cap")
        assert gate["name"] == "budget@3:cap0"
        engine.decide("cap", "budget@3:cap0", False, comment="stop here")
        with pytest.raises(errors.WorkflowFailedError) as info:
            engine.retrieve("cap").result(timeout=20)
        assert info.value.error_type.endswith("BudgetExceededError")
        assert vendor == ["call0", "call1", "call2", "call3"]  # denied: never called again
        ledger = engine.budget("cap")
        assert ledger is not None and ledger["spent"]["dollars"] == 0.9


def test_a_raise_lets_the_refused_step_run_again_and_the_rest_follow(database_url: str) -> None:
    reg, vendor, agent = cap_app("async")
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(agent, 5, workflow_id="cap-raise")
        _wait_status(engine, "cap-raise", "SUSPENDED")
        engine.raise_budget("cap-raise", dollars=0.5)
        assert handle.result(timeout=20) == [0, 1, 2, 3, 4]
        ledger = engine.budget("cap-raise")
        assert ledger is not None
        assert ledger["spent"] == {"dollars": 1.5, "tokens": 50, "steps": 5}
        assert vendor == ["call0", "call1", "call2", "call3", "call3", "call4"]


def test_a_reservation_that_does_not_fit_stops_the_call_before_it_is_made(
    database_url: str,
) -> None:
    reg = durable.Registry()
    vendor: list[str] = []

    @durable.tool(registry=reg)
    async def ask_model(prompt: str) -> str:
        with durable.reserve(dollars=0.5, tokens=1000):  # the estimate, before the call
            vendor.append(prompt)
            durable.charge(dollars=0.2, tokens=300)  # what it really cost
        return prompt.upper()

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=1.0))
    async def agent() -> list[str]:
        return [await ask_model(p) for p in ("a", "b", "c", "d", "e")]

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            handle = await engine.start_async(agent, workflow_id="reserve")
            while await handle.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.05)
            # 0.2 + 0.2 + 0.2 = 0.6 spent; a fourth estimate of 0.5 would pass 1.0.
            assert vendor == ["a", "b", "c"]
            ledger = engine.budget("reserve")
            assert ledger is not None and ledger["spent"]["dollars"] == pytest.approx(0.6)
            assert [g["name"] for g in engine.list_approvals("reserve")] == ["budget@3:cap0"]

    asyncio.run(main())


def test_a_time_budget_stops_the_next_step(database_url: str) -> None:
    reg = durable.Registry()
    ran: list[int] = []

    @durable.step(registry=reg)
    def work(i: int) -> int:
        ran.append(i)
        time.sleep(0.4)
        return i

    @durable.workflow(registry=reg, budget=durable.Budget(seconds=1.0))
    def timed(n: int) -> list[int]:
        return [work(i) for i in range(n)]

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(timed, 10, workflow_id="timed")
        _wait_status(engine, "timed", "SUSPENDED")
        assert 2 <= len(ran) <= 4  # about a second of 0.4 s steps, then the gate
        (gate,) = engine.list_approvals("timed")
        assert gate["name"] == f"budget@{len(ran)}"
        ledger = engine.budget("timed")
        assert ledger is not None and ledger["limits"]["seconds"] == 1.0
        engine.raise_budget("timed", seconds=60)
        assert handle.result(timeout=30) == list(range(10))


def test_bad_budget_input_is_refused_with_typed_errors(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    def negative() -> None:
        durable.reserve(dollars=-1)

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=1.0))
    def wf() -> None:
        negative()

    with pytest.raises(errors.NotInWorkflowError, match=r"durable\.reserve"):
        durable.reserve(dollars=0.1)
    with pytest.raises(errors.NotInWorkflowError, match=r"durable\.charge"):
        durable.charge(dollars=0.1)
    with pytest.raises(errors.InvalidBudgetError, match="seconds"):
        durable.Budget(seconds=-5)
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(wf, workflow_id="neg")
        with pytest.raises(errors.WorkflowFailedError, match="InvalidBudgetError"):
            handle.result(timeout=10)
        ledger = engine.budget("neg")
        assert ledger is not None and ledger["spent"]["dollars"] == 0.0


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_what_a_refused_attempt_charged_before_the_refusal_stays_spent(
    database_url: str, kind: str
) -> None:
    """A step makes two paid calls: the first charge fits, the second would pass the cap.
    The step is refused and not journaled, but the first call was paid for: the ledger
    keeps it, and a denied gate leaves it spent (a resume cannot reset it either)."""
    reg = durable.Registry()
    vendor: list[str] = []

    def two_calls(i: int) -> int:
        for call in ("a", "b"):
            vendor.append(f"{i}{call}")
            durable.charge(dollars=0.3, tokens=10)
        return i

    if kind == "sync":
        think = durable.step(registry=reg, name="think")(two_calls)

        @durable.workflow(registry=reg, budget=durable.Budget(dollars=1.0))
        def agent(n: int) -> list[int]:
            return [think(i) for i in range(n)]

    else:

        @durable.step(registry=reg, name="think")
        async def athink(i: int) -> int:
            return two_calls(i)

        @durable.workflow(registry=reg, budget=durable.Budget(dollars=1.0))
        async def agent(n: int) -> list[int]:
            return [await athink(i) for i in range(n)]

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        engine.start(agent, 3, workflow_id="paid")
        _wait_status(engine, "paid", "SUSPENDED")
        assert vendor == ["0a", "0b", "1a", "1b"]  # 0.6 journaled; 1a fits, 1b is refused
        ledger = engine.budget("paid")
        assert ledger is not None
        assert ledger["spent"]["dollars"] == pytest.approx(0.9)
        assert ledger["spent"]["tokens"] == 30
        engine.decide("paid", "budget@1:cap0", False, comment="stop")
        with pytest.raises(errors.WorkflowFailedError):
            engine.retrieve("paid").result(timeout=20)
        ledger = engine.budget("paid")
        assert ledger is not None and ledger["spent"]["dollars"] == pytest.approx(0.9)
