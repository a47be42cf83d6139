"""durable.workflow_id() and durable.step_id() in workflow and step code, both drivers: the
same on every attempt of a step and on a replay, each step's own position."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Connection

import durable
from durable import errors


def test_ids_in_sync_code(database_url: str) -> None:
    reg = durable.Registry()
    seen: list[tuple[str, int]] = []
    flaky = {"left": 1}

    @durable.step(registry=reg, name="ids.fetch", retries=2, initial_delay=0.01)
    def fetch() -> list[Any]:
        seen.append((durable.workflow_id(), durable.step_id()))
        if flaky["left"]:
            flaky["left"] -= 1
            raise RuntimeError("once")
        return [durable.workflow_id(), durable.step_id()]

    @durable.transaction(registry=reg, name="ids.write")
    def write(conn: Connection) -> int:
        return durable.step_id()

    @durable.effect(registry=reg, name="ids.notify", idempotent=True)
    def notify(*, idempotency_key: str) -> int:
        return durable.step_id()

    @durable.workflow(registry=reg, name="ids.flow")
    def flow() -> list[Any]:
        with pytest.raises(errors.NoEngineError, match="outside a step"):
            durable.step_id()
        return [durable.workflow_id(), fetch(), write(), notify(), fetch()]

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(flow, workflow_id="ids-1").result(timeout=30) == [
            "ids-1",
            ["ids-1", 0],
            1,
            2,
            ["ids-1", 3],
        ]
    assert seen == [("ids-1", 0), ("ids-1", 0), ("ids-1", 3)]  # a retry keeps its position
    with pytest.raises(errors.NoEngineError, match="outside a workflow"):
        durable.workflow_id()
    with pytest.raises(errors.NoEngineError, match="outside a step"):
        durable.step_id()


def test_ids_in_async_code(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg, name="ids.ask")
    async def ask(i: int) -> list[Any]:
        await asyncio.sleep(0.01 * (3 - i))  # finish out of order
        return [durable.workflow_id(), durable.step_id()]

    @durable.workflow(registry=reg, name="ids.fan")
    async def fan() -> list[Any]:
        return [durable.workflow_id(), *await asyncio.gather(*(ask(i) for i in range(3)))]

    async def main() -> list[Any]:
        async with durable.Engine(database_url, registry=reg) as engine:
            handle = await engine.start_async(fan, workflow_id="fan-1")
            return list(await handle.result(timeout=30))

    assert asyncio.run(main()) == ["fan-1", ["fan-1", 0], ["fan-1", 1], ["fan-1", 2]]
