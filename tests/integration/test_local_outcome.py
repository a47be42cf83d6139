"""A workflow started in this process hands its outcome to its own handle: `start(wf).result()`
costs the workflow's two statements (create, finish), with no read-back and no polling, and a
caller that waits without a limit runs a run no thread has begun on its own thread. Any end
but SUCCESS is still read from the database, and the value is what the database stores."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from types import SimpleNamespace

import pytest

import durable
from durable.errors import ResultTimeoutError, WorkflowFailedError


@dataclasses.dataclass
class Box:
    n: int


def make_app() -> tuple[durable.Registry, dict[str, object], SimpleNamespace]:
    reg = durable.Registry()
    seen: dict[str, object] = {}

    @durable.workflow(registry=reg, name="empty")
    def empty() -> int:
        seen["thread"] = threading.get_ident()
        return 1

    @durable.workflow(registry=reg, name="boxed")
    def boxed() -> dict[str, Box]:
        value = {"box": Box(2)}
        seen["value"] = value
        return value

    @durable.workflow(registry=reg, name="failing")
    def failing() -> int:
        raise ValueError("no")

    @durable.workflow(registry=reg, name="aempty")
    async def aempty() -> list[int]:
        return [1, 2]

    return reg, seen, SimpleNamespace(empty=empty, boxed=boxed, failing=failing, aempty=aempty)


def test_start_then_result_is_two_statements_run_on_the_callers_thread(database_url: str) -> None:
    reg, seen, app = make_app()
    with durable.Engine(database_url, registry=reg) as engine:
        counters = engine.client.db.counters
        engine.start(app.empty).result()  # warm
        costs = []
        for _ in range(5):
            before = counters.statements
            assert engine.start(app.empty).result() == 1
            costs.append(counters.statements - before)
            assert seen["thread"] == threading.get_ident()
        # insert_workflow, finish_workflow. (The engine's heartbeat reads cancel requests
        # while runs are in flight: on a loaded machine one may land inside a round.)
        assert min(costs) == 2, costs


def test_the_handed_over_value_is_the_stored_one(database_url: str) -> None:
    reg, seen, app = make_app()
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(app.boxed, workflow_id="b")
        got = handle.result()
        # Decoded from the stored text, as another process reads it: a fresh value, not
        # the object the workflow returned.
        with durable.Client(database_url) as client:
            assert got == {"box": {"n": 2}} == client.retrieve("b").result()
        assert got is not seen["value"]


def test_a_failure_is_still_read_from_the_database(database_url: str) -> None:
    reg, _, app = make_app()
    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(WorkflowFailedError, match="no"):
            engine.start(app.failing).result()


def test_a_caller_with_a_time_limit_does_not_run_it(database_url: str) -> None:
    reg = durable.Registry()
    release = threading.Event()
    where: list[int] = []

    @durable.workflow(registry=reg, name="held")
    def held() -> int:
        where.append(threading.get_ident())
        release.wait(10)
        return 3

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(held)
        with pytest.raises(ResultTimeoutError):
            handle.result(timeout=0.2)  # it runs on, on a thread of the engine
        release.set()
        assert handle.result(timeout=10) == 3
        assert where and where[0] != threading.get_ident()


def test_start_async_then_result_is_two_statements(database_url: str) -> None:
    reg, _, app = make_app()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            counters = engine.client.db.counters
            await (await engine.start_async(app.aempty)).result()  # warm
            costs = []
            for _ in range(5):
                before = counters.statements
                assert await (await engine.start_async(app.aempty)).result() == [1, 2]
                costs.append(counters.statements - before)
            assert min(costs) == 2, costs  # (see above: a heartbeat may land in a round)

    asyncio.run(main())


def test_callers_waiting_at_once_run_no_more_than_the_engines_threads(database_url: str) -> None:
    reg = durable.Registry()
    lock = threading.Lock()
    now = [0]
    peak = [0]

    @durable.workflow(registry=reg, name="busy")
    def busy() -> int:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        threading.Event().wait(0.05)
        with lock:
            now[0] -= 1
        return 1

    with durable.Engine(database_url, registry=reg, max_workers=2) as engine:

        def caller() -> None:
            for _ in range(3):
                assert engine.start(busy).result() == 1

        threads = [threading.Thread(target=caller) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert peak[0] <= 2
