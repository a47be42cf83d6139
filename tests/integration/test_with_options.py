"""durable.with_options(fn, ...) carries a start's options with the workflow: each start,
submit and enqueue (sync and awaited, and durable.start_child) runs the workflow under the
id, timeout, attributes and queue options it gives, as the keyword form does; a start
refuses an enqueue's option, an option given twice, and a call of the carrier itself; a
call that takes no options (start_or_send) refuses them rather than dropping them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import durable
from durable.errors import ConfigurationError

reg = durable.Registry()
elsewhere = durable.Registry()  # no worker here has it: its queued runs stay put
queue = durable.Queue("wo.q", registry=elsewhere)


@durable.workflow(registry=reg, name="wo.add")
def add(x: int, y: int) -> int:
    return x + y


@durable.workflow(registry=reg, name="wo.add_async")
async def add_async(x: int, y: int) -> int:
    return x + y


@durable.workflow(registry=reg, name="wo.parent")
def parent(x: int) -> str:
    child = durable.start_child(durable.with_options(add, workflow_id="wo-child"), x, 1)
    assert child.result() == x + 1
    return child.workflow_id


@durable.workflow(registry=elsewhere, name="wo.idle")
def idle(n: int) -> int:
    return n


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng


def test_start_and_submit_take_the_id_and_options_of_with_options(engine: durable.Engine) -> None:
    handle = engine.start(durable.with_options(add, workflow_id="wo-1", timeout=60), 2, y=3)
    assert handle.workflow_id == "wo-1"
    assert handle.result(timeout=30) == 5
    info = engine.get_workflow("wo-1")
    assert info.name == "wo.add"
    # The same id again is the same workflow (ids are idempotency keys), as with the keyword.
    again = engine.start(durable.with_options(add, workflow_id="wo-1"), 2, 3)
    assert again.workflow_id == "wo-1" and again.result(timeout=30) == 5

    submitted = engine.submit(
        durable.with_options(add, workflow_id="wo-2", attributes={"customer": "c-9"}), 4, 5
    )
    assert submitted.workflow_id == "wo-2"  # (recorded for a worker: this engine is none)
    tagged = durable.RunFilter(attributes={"customer": "c-9"})
    assert [i.workflow_id for i in engine.client.list_workflows(filter=tagged)] == ["wo-2"]


def test_start_async_takes_the_id_of_with_options(database_url: str) -> None:
    async def main() -> tuple[str, int]:
        async with durable.Engine(database_url, registry=reg) as engine:
            handle = await engine.start_async(
                durable.with_options(add_async, workflow_id="wo-3"), 1, 2
            )
            return handle.workflow_id, await handle.result(timeout=30)

    assert asyncio.run(main()) == ("wo-3", 3)


def test_start_child_takes_the_id_of_with_options(engine: durable.Engine) -> None:
    handle = engine.start(durable.with_options(parent, workflow_id="wo-p"), 6)
    assert handle.result(timeout=30) == "wo-child"
    assert engine.get_workflow("wo-child").name == "wo.add"


def test_enqueue_takes_the_queue_options_of_with_options(database_url: str) -> None:
    with durable.Client(database_url) as client:
        handle = client.enqueue(
            queue, durable.with_options(idle, workflow_id="wo-q1", dedup_key="k"), 1
        )
        assert handle.workflow_id == "wo-q1"
        assert handle.status() == durable.WorkflowStatus.ENQUEUED
        # The dedup key came along: a second entry with it is refused.
        with pytest.raises(durable.errors.QueueDedupError):
            client.enqueue(queue, durable.with_options(idle, dedup_key="k"), 2)
    with durable.Engine(database_url, registry=reg) as engine:
        on_queue = queue.enqueue(durable.with_options(idle, workflow_id="wo-q2"), 3)
        assert on_queue.workflow_id == "wo-q2"
        by_engine = engine.enqueue(queue, durable.with_options(idle, workflow_id="wo-q3"), 4)
        assert by_engine.workflow_id == "wo-q3"
        assert by_engine.status() == durable.WorkflowStatus.ENQUEUED


def test_a_start_refuses_an_enqueue_option_a_repeated_option_and_a_call(
    engine: durable.Engine,
) -> None:
    with pytest.raises(ConfigurationError, match="dedup_key= is an option of an enqueue"):
        engine.start(durable.with_options(add, dedup_key="k"), 1, 2)
    with pytest.raises(ConfigurationError, match="workflow_id= given both"):
        engine.start(durable.with_options(add, workflow_id="a"), 1, 2, workflow_id="b")
    with pytest.raises(ConfigurationError, match="given twice"):
        durable.with_options(durable.with_options(add, workflow_id="a"), workflow_id="b")
    with pytest.raises(ConfigurationError, match="is started, not called"):
        durable.with_options(add, workflow_id="a")(1, 2)
    # A call that takes no options refuses them rather than dropping them.
    with pytest.raises(ConfigurationError, match="taken by a start"):
        engine.start_or_send(
            durable.with_options(add, timeout=5), 1, 2, workflow_id="a", message="m"
        )
    assert engine.client.list_workflows() == []
