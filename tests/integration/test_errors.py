"""Bad input gets a typed error with a fix hint, and never changes a stored workflow."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import durable
from durable import errors


def snapshot(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        wfs = conn.execute(
            "SELECT workflow_id, name, status, inputs, output, error, epoch"
            " FROM durable.workflows ORDER BY workflow_id"
        ).fetchall()
        steps = conn.execute(
            "SELECT workflow_id, step_seq, step_name, output, error FROM durable.steps"
            " ORDER BY workflow_id, step_seq"
        ).fetchall()
    return [*wfs, *steps]


@pytest.fixture
def app() -> tuple[durable.Registry, Any, Any, Any]:
    reg = durable.Registry()

    @durable.step(registry=reg, name="echo")
    def echo(value: Any) -> Any:
        return value

    @durable.workflow(registry=reg, name="wf_a")
    def wf_a(value: Any) -> Any:
        return echo(value)

    @durable.workflow(registry=reg, name="wf_b")
    def wf_b(value: Any) -> Any:
        return value

    return reg, echo, wf_a, wf_b


def test_conflicting_workflow_id(database_url: str, app: Any) -> None:
    reg, _echo, wf_a, wf_b = app
    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(wf_a, 1, workflow_id="taken").result(timeout=10)
        before = snapshot(database_url)
        with pytest.raises(errors.WorkflowConflictError, match="choose another workflow_id"):
            engine.start(wf_b, 2, workflow_id="taken")
        assert snapshot(database_url) == before


def test_unserializable_input_stores_nothing(database_url: str, app: Any) -> None:
    reg, _echo, wf_a, _ = app
    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.SerializationError, match="inputs of workflow 'wf_a'") as info:
            engine.start(wf_a, object(), workflow_id="bad-input")
        assert info.value.type_name == "object"
        assert "argument 0" in str(info.value)
        assert "JSON-compatible" in str(info.value)
        assert snapshot(database_url) == []


def test_unserializable_step_output_writes_no_step(database_url: str, app: Any) -> None:
    reg, _echo, wf_a, _ = app
    with durable.Engine(database_url, registry=reg) as engine:
        # A set would come back from the journal as a list: refused before anything is stored.
        with pytest.raises(errors.SerializationError, match="set is stored as JSON"):
            engine.start(wf_a, {1, 2}, workflow_id="bad-input")
        with pytest.raises(errors.WorkflowNotFoundError):
            engine.get_workflow("bad-input")

        @durable.step(registry=reg, name="returns_socket")
        def returns_object() -> object:
            return object()

        @durable.workflow(registry=reg, name="wf_obj")
        def wf_obj() -> object:
            return returns_object()

        handle = engine.start(wf_obj, workflow_id="obj")
        with pytest.raises(errors.WorkflowFailedError) as info:
            handle.result(timeout=10)
        assert info.value.error_type == "durable.errors.SerializationError"
        assert "step 'returns_socket'" in info.value.error_message
        assert engine.steps("obj") == []


def test_payload_too_large(database_url: str, app: Any) -> None:
    reg, _echo, wf_a, _ = app
    with durable.Engine(database_url, registry=reg, max_payload_bytes=1000) as engine:
        with pytest.raises(errors.PayloadTooLargeError, match="max_payload_bytes") as info:
            engine.start(wf_a, "x" * 2000, workflow_id="big")
        assert info.value.size > 1000 and info.value.limit == 1000
        assert snapshot(database_url) == []


def test_duplicate_and_invalid_definitions() -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="dup")
    def one() -> None: ...

    with pytest.raises(errors.DuplicateNameError, match="name="):

        @durable.workflow(registry=reg, name="dup")
        def two() -> None: ...

    with pytest.raises(errors.DefinitionError, match="retries"):
        durable.step(retries=-1, registry=reg)
    with pytest.raises(errors.DefinitionError, match="generator"):

        @durable.step(registry=reg)
        async def agen() -> Any:
            yield 1

    with pytest.raises(errors.DefinitionError, match="connection"):

        @durable.transaction(registry=reg)
        def no_conn(*, x: int) -> None: ...

    with pytest.raises(errors.DefinitionError, match="durability"):
        durable.workflow(durability="sometimes", registry=reg)  # type: ignore[call-overload]


def test_not_a_workflow_and_engine_not_running(database_url: str, app: Any) -> None:
    reg, echo, wf_a, _ = app
    engine = durable.Engine(database_url, registry=reg)
    with pytest.raises(errors.EngineNotRunningError, match="with engine"):
        engine.start(wf_a, 1)
    with engine:
        with pytest.raises(errors.DefinitionError, match="not a workflow"):
            engine.start(echo, 1)
        with pytest.raises(errors.WorkflowNotFoundError, match="workflows list"):
            engine.retrieve("nope")


def test_unreachable_database() -> None:
    engine = durable.Engine(
        "postgresql://nobody@127.0.0.1:1/none", registry=durable.Registry(), connect_timeout=1
    )
    with pytest.raises(errors.DatabaseUnavailableError, match="PostgreSQL is running"):
        with engine:
            pass  # pragma: no cover


def test_migrate_false_on_empty_database(bare_database_url: str) -> None:
    engine = durable.Engine(bare_database_url, registry=durable.Registry(), migrate=False)
    with pytest.raises(errors.MigrationError, match="durable migrate"):
        with engine:
            pass  # pragma: no cover
