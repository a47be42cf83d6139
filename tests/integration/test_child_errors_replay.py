"""A child called directly fails the same way in its parent on the first run and on every
replay: the parent's `except` branch cannot change between them (a replay taking another
branch would make other calls, or return another value)."""

from __future__ import annotations

import time
from typing import Any

import durable
from durable import errors


def app() -> tuple[durable.Registry, Any]:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="outcomes.wait", timeout=0.3)
    def slow_child() -> Any:
        return durable.recv("never", timeout=600)

    @durable.workflow(registry=reg, name="outcomes.parent")
    def parent(which: str) -> str:
        try:
            slow_child()
            branch = "ok"
        except errors.WorkflowTimeoutError:
            branch = "WorkflowTimeoutError"
        except errors.WorkflowCancelledError:
            branch = "WorkflowCancelledError"
        except Exception as exc:
            branch = type(exc).__name__
        # Parks, so that the rest runs in a new run that replays the child's call.
        durable.recv("go", timeout=600)
        return branch

    return reg, parent


def test_a_timed_out_child_raises_the_same_error_on_replay(database_url: str) -> None:
    reg, parent = app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(parent, "timeout", workflow_id="p")
        deadline = time.monotonic() + 30
        while engine.get_workflow("p").status != durable.WorkflowStatus.SUSPENDED:
            assert time.monotonic() < deadline, "the parent never parked"
            time.sleep(0.05)
        engine.send(handle.workflow_id, "now", topic="go")
        assert handle.result(timeout=30) == "WorkflowTimeoutError"
