"""An Engine holds a Client (`engine.client`) on its own pool: every read and operator
action is there, the engine offers the most used ones, and using the client as a context
manager does not stop the engine it belongs to."""

from __future__ import annotations

import psycopg
import pytest

import durable

reg = durable.Registry()


@durable.step(registry=reg, name="engine_client.double")
def double(x: int) -> int:
    return 2 * x


@durable.workflow(registry=reg, name="engine_client.doubled")
def doubled(x: int) -> int:
    return double(x)


def _connections(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_engines_client_reads_what_it_ran_on_the_engines_pool(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(doubled, 21, workflow_id="w").result(timeout=10) == 42
        client = engine.client
        assert client.db is engine.runner.db  # one pool, not a second one
        assert client.get_workflow("w").status is durable.WorkflowStatus.SUCCESS
        assert client.steps("w") == engine.steps("w")
        assert [s.step_name for s in engine.steps("w")] == ["engine_client.double"]
        assert client.retrieve("w").result(timeout=5) == engine.retrieve("w").result() == 42


def test_with_engine_client_leaves_the_engine_running(database_url: str) -> None:
    with durable.Engine(database_url, registry=reg) as engine:
        before = _connections(database_url)
        with engine.client as client:
            assert client.get_workflow(engine.start(doubled, 1).workflow_id)
        assert engine.running and engine.client.running
        assert engine.start(doubled, 2, workflow_id="after").result(timeout=10) == 4
        # The pool was not opened again: the same pool, grown by at most the connection
        # or two that concurrent checkouts (the run, its start, the result's read) may add.
        assert _connections(database_url) <= before + 2
    assert not engine.client.running


def test_a_client_used_before_launch_does_not_stop_the_engine_from_launching(
    database_url: str,
) -> None:
    engine = durable.Engine(database_url, registry=reg)
    client = engine.client
    with client:  # its own small pool, before the engine runs
        assert client.list_workflows() == []
    client.connect()
    with engine:
        assert engine.running
        assert engine.start(doubled, 5).result(timeout=10) == 10
        assert engine.client is client and client.db is engine.runner.db
    assert not engine.running


def test_an_engines_settings_are_not_attributes_to_set(database_url: str) -> None:
    engine = durable.Engine(database_url, registry=reg)
    with pytest.raises(durable.errors.ConfigurationError, match="Engine\\(\\.\\.\\.\\) arguments"):
        engine.max_workers = 2  # type: ignore[attr-defined]
    client = engine.client
    engine._override(max_workers=2)  # as `durable worker --concurrency 2` does
    assert engine.client is client and client.config.max_workers == 2
