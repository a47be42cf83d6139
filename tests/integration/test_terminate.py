"""Client.terminate: a workflow and its unfinished descendants end CANCELLED at once, no
compensation runs, and a parent that waits for a terminated child sees its end."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import durable

reg = durable.Registry()
release = threading.Event()
undone: list[str] = []


@durable.effect(registry=reg, name="term.book", idempotent=True)
def book(key: str, *, idempotency_key: str) -> str:
    return key


@book.compensation
@durable.effect(registry=reg, name="term.unbook", idempotent=True)
def unbook(key: str, *, idempotency_key: str) -> None:
    undone.append(key)


@durable.step(registry=reg, name="term.block")
def block() -> str:
    assert release.wait(30), "never released"
    return "released"


@durable.workflow(registry=reg, name="term.child")
def child() -> str:
    book("seat")
    return block()


@durable.workflow(registry=reg, name="term.parent")
def parent() -> str:
    try:
        return child()
    except durable.errors.DurableError as exc:
        return f"child ended: {type(exc).__name__}"


@pytest.fixture
def engine(database_url: str) -> Iterator[durable.Engine]:
    release.clear()
    undone.clear()
    with durable.Engine(database_url, registry=reg) as eng:
        yield eng
    release.set()


def test_a_terminated_child_ends_without_its_undo_and_its_parent_goes_on(
    engine: durable.Engine,
) -> None:
    handle = engine.start(parent, workflow_id="p-1")
    deadline = time.monotonic() + 20
    while not engine.client.list_children(["p-1"]) or not engine.client.steps(
        engine.client.list_children(["p-1"])["p-1"][0]["workflow_id"]
    ):
        assert time.monotonic() < deadline, "the child never booked"
        time.sleep(0.05)
    [kid] = engine.client.list_children(["p-1"])["p-1"]
    status = engine.client.terminate(kid["workflow_id"], "stuck")
    assert status is durable.WorkflowStatus.CANCELLED
    release.set()
    assert handle.result(timeout=20).startswith("child ended: ")
    assert engine.client.get_workflow(kid["workflow_id"]).status is (
        durable.WorkflowStatus.CANCELLED
    )
    assert undone == []  # a terminate undoes nothing
    [row] = engine.client.audit_log(kid["workflow_id"])
    assert row["action"] == "terminate" and row["detail"] == "stuck"
    again = engine.client.terminate(kid["workflow_id"], "again")
    assert again is durable.WorkflowStatus.CANCELLED and len(engine.client.audit_log()) == 1
