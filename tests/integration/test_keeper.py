"""An engine that is not a worker keeps watching the workflows it started: one it is about
to create (remembered just before its row is written) is not let go as gone, and one that
is really gone (pruned) is let go after a while."""

from __future__ import annotations

import time

import pytest

import durable
from durable._host import recovery as _recovery


def test_a_workflow_remembered_before_its_row_exists_is_still_watched(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_recovery, "_KEEP_GONE", 1.0)
    with durable.Engine(database_url, registry=durable.Registry()) as engine:
        # What lifecycle.start does first: its row comes a moment later (under load, after
        # a keeper round or several).
        engine.runner.remember("being-created")
        time.sleep(0.5)  # several rounds of the keeper (every 50 ms while it watches)
        assert "being-created" in engine.runner.own()
        deadline = time.monotonic() + 10
        while "being-created" in engine.runner.own():  # never written: let go at last
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_workflow_started_while_the_keeper_looks_is_resumed_after_its_sleep(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="keeper.naps")
    def naps() -> str:
        durable.sleep(1.2)  # suspends: only the keeper brings it back
        return "awake"

    with durable.Engine(database_url, registry=reg) as engine:
        engine.runner.remember("nap")
        time.sleep(0.3)  # the keeper looks while its row is not there yet
        assert engine.start(naps, workflow_id="nap").result(timeout=30) == "awake"


def _keeper_only(
    database_url: str, reg: durable.Registry
) -> tuple[durable.Engine, durable.FakeClock]:
    """An engine that is not a worker (its keeper resumes what it started), on a clock
    the test moves."""
    clock = durable.FakeClock()
    return durable.Engine(database_url, registry=reg, clock=clock), clock


def test_an_approval_nobody_decides_times_out_under_the_keeper(database_url: str) -> None:
    """No worker runs: the keeper of the engine that started the workflow brings it back
    when its gate's time is up, and the gate's default decides."""
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="keeper.gate")
    def gated() -> str:
        decision = durable.approval("ship", timeout=60, default=True)
        return f"approved={decision.approved} timed_out={decision.timed_out}"

    engine, clock = _keeper_only(database_url, reg)
    with engine:
        handle = engine.start(gated, workflow_id="gate-kept")
        _wait_for_status(engine, "gate-kept", "SUSPENDED")
        clock.advance(61)
        assert handle.result(timeout=30) == "approved=True timed_out=True"
        (gate,) = engine.list_approvals("gate-kept", waiting_only=False)
        assert gate["status"] == "timed_out"


def test_an_async_workflows_approval_times_out_under_the_keeper(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="keeper.gate_async")
    async def gated() -> bool:
        decision = await durable.approval_async("ship", timeout=60)
        return decision.timed_out and not decision.approved

    engine, clock = _keeper_only(database_url, reg)
    with engine:
        handle = engine.start(gated, workflow_id="gate-kept-async")
        _wait_for_status(engine, "gate-kept-async", "SUSPENDED")
        clock.advance(61)
        assert handle.result(timeout=30) is True


def test_a_recv_nobody_sends_to_times_out_under_the_keeper(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="keeper.recv")
    def listens() -> str:
        return repr(durable.recv("news", timeout=60))

    engine, clock = _keeper_only(database_url, reg)
    with engine:
        handle = engine.start(listens, workflow_id="recv-kept")
        _wait_for_status(engine, "recv-kept", "SUSPENDED")
        clock.advance(61)
        assert handle.result(timeout=30) == "None"


def test_a_long_sleep_ends_under_the_keeper(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="keeper.sleeps")
    def sleeps() -> str:
        durable.sleep(3600)
        return "awake"

    engine, clock = _keeper_only(database_url, reg)
    with engine:
        handle = engine.start(sleeps, workflow_id="sleep-kept")
        _wait_for_status(engine, "sleep-kept", "SUSPENDED")
        clock.advance(3601)
        assert handle.result(timeout=30) == "awake"


def _wait_for_status(engine: durable.Engine, workflow_id: str, status: str) -> None:
    deadline = time.monotonic() + 20
    while engine.get_workflow(workflow_id).status != status:
        assert time.monotonic() < deadline, f"{workflow_id} never became {status}"
        time.sleep(0.05)
