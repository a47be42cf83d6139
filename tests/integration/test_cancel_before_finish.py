"""A cancel requested while the last call runs wins over the SUCCESS that follows it.

The rule: a workflow asked to stop before its outcome is written ends CANCELLED, with its
applied effects undone (its compensations run), whether the request meets it at a call or
only at its finish. Never SUCCESS with a cancel request standing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import durable
from durable import errors

RELEASE = threading.Event()
RUNNING = threading.Event()
WORLD: list[str] = []


def app() -> tuple[durable.Registry, Any]:
    reg = durable.Registry()

    @durable.effect(registry=reg, name="cbf.book", idempotent=True)
    def book(item: str, *, idempotency_key: str) -> str:
        WORLD.append(f"book:{item}")
        return item

    @book.compensation  # type: ignore[attr-defined]
    @durable.effect(registry=reg, name="cbf.unbook", idempotent=True)
    def unbook(item: str, *, idempotency_key: str) -> None:
        WORLD.append(f"unbook:{item}")

    @durable.step(registry=reg, name="cbf.last")
    def last() -> str:
        RUNNING.set()
        assert RELEASE.wait(30)
        return "done"

    @durable.workflow(registry=reg, name="cbf.trip")
    def trip(with_booking: bool) -> str:
        if with_booking:
            book("flight")
        return last()

    return reg, trip


def status(engine: durable.Engine, workflow_id: str) -> durable.WorkflowStatus:
    return engine.get_workflow(workflow_id).status


@pytest.mark.parametrize("with_booking", [False, True])
def test_a_cancel_during_the_last_step_ends_cancelled(
    database_url: str, with_booking: bool
) -> None:
    RELEASE.clear()
    RUNNING.clear()
    WORLD.clear()
    reg, trip = app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(trip, with_booking, workflow_id="trip")
        assert RUNNING.wait(30)
        engine.cancel("trip")
        RELEASE.set()  # the last step ends; the body returns its value
        with pytest.raises(errors.WorkflowCancelledError):
            handle.result(timeout=30)
        deadline = time.monotonic() + 30
        while status(engine, "trip") is durable.WorkflowStatus.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert status(engine, "trip") is durable.WorkflowStatus.CANCELLED
        # The last step's record stands (it ran); its value is no outcome.
        assert "cbf.last" in [s.step_name for s in engine.client.steps("trip")]
    expected = ["book:flight", "unbook:flight"] if with_booking else []
    assert WORLD == expected
