"""What both drivers read through the context variables (`durable._run.context`): the context
of a run's body, the run of the calling workflow, and where a decorated call made outside
any workflow goes, with the errors (in sync and in async words) when it cannot."""

from __future__ import annotations

import contextvars
from typing import Any

import pytest

from durable._core import StepScope
from durable._run.context import (
    check_effect_key,
    current_engine,
    current_run,
    current_step,
    engine_for,
    running,
    workflow_run,
)
from durable.errors import (
    AsyncInSyncError,
    BlockingCallError,
    EffectOutsideWorkflowError,
    NoEngineError,
)
from tests.unit.scripted import effect_def, make_run, step_def, workflow_def


def wf() -> None:
    pass


def tx(conn: Any) -> None:
    pass


class Host:
    active: Any = "the run's engine"


def in_context(fn: Any) -> Any:
    """Run `fn` in a fresh context (nothing current, nothing active)."""
    return contextvars.Context().run(fn)


def test_a_runs_body_has_its_run_no_step_and_its_engine_until_it_ends() -> None:
    def body() -> None:
        run = make_run()
        current_step.set(StepScope("outer"))
        with running(run, "engine"):  # type: ignore[arg-type]
            assert current_run.get() is run
            assert current_step.get() is None
            assert current_engine.get() == "engine"
        assert current_run.get() is None
        assert current_step.get() == StepScope("outer")
        assert current_engine.get() is None

    in_context(body)


@pytest.mark.parametrize("is_async", [False, True])
def test_a_workflow_call_needs_an_engine(is_async: bool) -> None:
    with pytest.raises(NoEngineError) as raised:
        in_context(lambda: engine_for(workflow_def(wf), is_async))
    if is_async:
        assert str(raised.value) == (
            "workflow 'wf' was called with no active engine: wrap the call in "
            "`async with durable.Engine(...) as engine:` or use await "
            "engine.start_async(fn, ...)"
        )
    else:
        assert str(raised.value) == (
            "workflow 'wf' was called with no active engine: wrap the call in "
            "`with durable.Engine(...) as engine:` or use engine.start(fn, ...)"
        )


@pytest.mark.parametrize("is_async", [False, True])
def test_a_transaction_call_needs_an_engine(is_async: bool) -> None:
    with pytest.raises(NoEngineError) as raised:
        in_context(lambda: engine_for(step_def(tx), is_async))
    within = "async with" if is_async else "with"
    assert str(raised.value) == (
        f"transaction 'tx' needs a database connection: call it inside "
        f"`{within} durable.Engine(...):`"
    )


def test_the_engine_is_the_active_one_or_in_a_steps_code_its_runs() -> None:
    def active() -> Any:
        current_engine.set("active")  # type: ignore[arg-type]
        return engine_for(workflow_def(wf))

    def in_a_step() -> Any:
        current_engine.set("active")  # type: ignore[arg-type]
        current_run.set(make_run(host=Host()))
        return engine_for(workflow_def(wf))

    assert in_context(active) == "active"
    assert in_context(in_a_step) == "the run's engine"


def test_an_effect_outside_a_workflow_needs_a_key() -> None:
    defn = effect_def(wf, idempotent=True)
    check_effect_key(defn, {"idempotency_key": "k"})
    with pytest.raises(EffectOutsideWorkflowError) as raised:
        check_effect_key(defn, {})
    assert str(raised.value) == (
        "effect 'wf' was called outside a workflow without a key: call it from a "
        "workflow, or pass idempotency_key=... yourself"
    )


def test_a_workflow_only_call_outside_a_workflow() -> None:
    with pytest.raises(NoEngineError, match=r"^durable.sleep\(\) must be called from a work"):
        in_context(lambda: workflow_run("durable.sleep()"))
    with pytest.raises(NoEngineError, match=r"^durable.sleep_async\(\) must be awaited in a"):
        in_context(lambda: workflow_run("durable.sleep_async()", is_async=True))


def test_a_workflow_only_call_from_a_workflow_of_the_other_kind_names_its_twin() -> None:
    def sync_call_in_async_workflow() -> Any:
        current_run.set(make_run(is_async=True))
        return workflow_run("durable.sleep()")

    def async_call_in_sync_workflow() -> Any:
        current_run.set(make_run())
        return workflow_run("durable.sleep_async()", is_async=True)

    with pytest.raises(BlockingCallError) as blocking:
        in_context(sync_call_in_async_workflow)
    assert str(blocking.value) == (
        "durable.sleep() would block the event loop of async workflow 'order': "
        "write `await durable.sleep_async()`"
    )
    with pytest.raises(AsyncInSyncError) as not_async:
        in_context(async_call_in_sync_workflow)
    assert str(not_async.value) == (
        "durable.sleep_async() is for async workflows; in the plain-def workflow 'order' "
        "call durable.sleep() instead"
    )
    run = make_run()
    assert in_context(lambda: (current_run.set(run), workflow_run("durable.sleep()"))[1]) is run
