"""durable.Debouncer in one process: the push back, max_wait, the async twin, and what is
refused. (Across processes: tests/acceptance/test_debounce.py.)"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

import durable
from durable import errors
from tests.acceptance.workers import scalar

START = dt.datetime(2026, 2, 1, 12, 0, tzinfo=dt.UTC)


def available_at(url: str, workflow_id: str) -> Any:
    return scalar(
        url, "SELECT available_at FROM durable.workflows WHERE workflow_id = %s", workflow_id
    )


def test_debouncing_again_replaces_the_input_and_pushes_the_start_back(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="sync")
    def sync(user: str, text: str) -> str:
        return f"{user}: {text}"

    debouncer = durable.Debouncer(sync, period=60, registry=reg)
    clock = durable.FakeClock(START)
    with durable.Client(database_url, clock=clock) as client:
        first = client.debounce(debouncer, "u1", "u1", "a")
        at_first = available_at(database_url, first.workflow_id)
        assert at_first - START >= dt.timedelta(seconds=60)
        clock.advance(30)
        second = client.debounce(debouncer, "u1", "u1", "b")
        assert second.workflow_id == first.workflow_id  # the same entry...
        assert available_at(database_url, first.workflow_id) - at_first >= dt.timedelta(
            seconds=30
        )  # ...starting 30 s later
        other = client.debounce(debouncer, "u2", "u2", "c")  # another key: its own entry
        assert other.workflow_id != first.workflow_id
        assert first.status() == "ENQUEUED"
    # A worker whose clock is past the period runs each entry once, with its last input.
    clock.advance(120)
    with durable.Engine(database_url, registry=reg, clock=clock, worker=True) as engine:
        assert engine.retrieve(first.workflow_id).result(timeout=30) == "u1: b"
        assert engine.retrieve(other.workflow_id).result(timeout=30) == "u2: c"
    with durable.Client(database_url, clock=clock) as client:
        # It started: the key's next debounce is a new entry.
        third = client.debounce(debouncer, "u1", "u1", "d")
        assert third.workflow_id != first.workflow_id
        assert third.status() == "ENQUEUED"


def test_max_wait_bounds_how_long_a_stream_of_debounces_postpones_the_run(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="digest")
    def digest(text: str) -> str:
        return text

    debouncer = durable.Debouncer(digest, period=60, max_wait=150, registry=reg)
    clock = durable.FakeClock(START)
    with durable.Client(database_url, clock=clock) as client:
        handle = client.debounce(debouncer, "k", "t0")
        created = scalar(
            database_url,
            "SELECT created_at FROM durable.workflows WHERE workflow_id = %s",
            handle.workflow_id,
        )
        for i in range(1, 6):  # every 50 s: the period alone would never pass
            clock.advance(50)
            assert client.debounce(debouncer, "k", f"t{i}").workflow_id == handle.workflow_id
        # Never later than 150 s after the first debounce.
        assert available_at(database_url, handle.workflow_id) == created + dt.timedelta(seconds=150)
    with durable.Engine(database_url, registry=reg, clock=clock, worker=True) as engine:
        # At once: its max wait is over.
        assert engine.retrieve(handle.workflow_id).result(timeout=30) == "t5"


def test_the_async_twin_and_the_engine_of_with(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="notify")
    async def notify(text: str) -> str:
        return text

    debouncer = durable.Debouncer(notify, period=0.2, registry=reg)

    async def main() -> str:
        async with durable.Engine(database_url, registry=reg, worker=True):
            first = await debouncer.debounce_async("k", "one")
            second = await debouncer.debounce_async("k", "two")
            assert first.workflow_id == second.workflow_id
            result: str = await second.result()
            return result

    assert asyncio.run(main()) == "two"
    with durable.Engine(database_url, registry=reg, worker=True):
        assert debouncer.debounce("k", "three").result(timeout=30) == "three"


def test_from_workflow_code_a_debounce_is_journaled(database_url: str) -> None:
    """The debounced entry runs while the workflow sleeps; the workflow's body then runs
    again from the top, and its debounce replays from the journal: no second entry."""
    reg = durable.Registry()
    ran: list[str] = []

    @durable.workflow(registry=reg, name="w")
    def w(text: str) -> str:
        ran.append(text)
        return text

    debouncer = durable.Debouncer(w, period=0.1, registry=reg)

    @durable.workflow(registry=reg, name="caller")
    def caller() -> str:
        workflow_id = debouncer.debounce("k", "from a workflow").workflow_id
        durable.sleep(1.5)  # suspends: the body runs again after it
        return workflow_id

    @durable.workflow(registry=reg, name="async_caller")
    async def async_caller() -> str:
        handle = await debouncer.debounce_async("k2", "from an async workflow")
        await durable.sleep_async(1.5)
        return handle.workflow_id

    with durable.Engine(database_url, registry=reg, worker=True) as engine:
        entry = engine.start(caller, workflow_id="caller").result(timeout=30)
        assert engine.retrieve(entry).result(timeout=30) == "from a workflow"
        other = engine.start(async_caller, workflow_id="async-caller").result(timeout=30)
        assert engine.retrieve(other).result(timeout=30) == "from an async workflow"
        names = [s.step_name for s in engine.steps("caller")]
        assert names.count("durable.debounce") == 1
    assert sorted(ran) == ["from a workflow", "from an async workflow"]  # once each


def test_what_is_refused(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="w")
    def w(text: str) -> str:
        return text

    for bad in ({"period": 0}, {"period": -1}, {"period": True}, {"period": 1, "max_wait": 0}):
        with pytest.raises(errors.ConfigurationError):
            durable.Debouncer(w, registry=reg, **bad)
    debouncer = durable.Debouncer(w, period=60, registry=reg)
    assert durable.Debouncer(w, period=5, registry=reg).queue is debouncer.queue  # one queue
    with pytest.raises(errors.NoEngineError):
        debouncer.debounce("k", "x")
    with durable.Engine(database_url, registry=reg):
        with pytest.raises(errors.WorkflowArgumentsError):
            debouncer.debounce("k", "x", "too many")
        with pytest.raises(errors.InvalidNameError):
            debouncer.debounce("", "x")
