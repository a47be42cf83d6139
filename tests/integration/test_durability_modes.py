"""Durability modes: how many writes each makes, and that barriers write what is held."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import durable


def app(mode: str | None) -> tuple[durable.Registry, Any, list[str]]:
    reg = durable.Registry()
    seen: list[str] = []

    @durable.step(registry=reg, name="pure")
    def pure(i: int) -> int:
        return i

    @durable.effect(registry=reg, name="send", idempotent=True)
    def send(i: int, *, idempotency_key: str) -> int:
        seen.append(idempotency_key)
        return i

    @durable.workflow(registry=reg, name="mixed", durability=mode)  # type: ignore[arg-type]
    def mixed(n: int, effect_at: int) -> int:
        total = 0
        for i in range(n):
            total += send(i) if i == effect_at else pure(i)
        return total

    return reg, mixed, seen


def journal(url: str, workflow_id: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        return [
            (r[0], r[1])
            for r in conn.execute(
                "SELECT step_seq, kind FROM durable.steps WHERE workflow_id = %s ORDER BY 1",
                [workflow_id],
            )
        ]


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_every_mode_journals_everything_by_the_end(database_url: str, mode: str) -> None:
    reg, mixed, seen = app(mode)
    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(mixed, 50, 25, workflow_id="m").result(timeout=30) == sum(range(50))
        info = engine.get_workflow("m")
        assert info.durability == mode
    assert [s for s, _ in journal(database_url, "m")] == list(range(50))
    assert seen == ["m:25"]


def test_exit_mode_writes_at_barriers_only(database_url: str) -> None:
    reg, mixed, _seen = app("exit")
    with durable.Engine(database_url, registry=reg) as engine:
        mixed(3, -1)  # warm up
        before = engine.client.db.counters.statements
        mixed(100, 50)
        used = engine.client.db.counters.statements - before
    # insert workflow; batch before the effect; effect intent, pending, settle+record (2);
    # batch of the rest; finish: a constant, not one per step.
    assert used <= 10


def test_async_mode_batches_and_flushes(database_url: str) -> None:
    reg, mixed, _seen = app("async")
    with durable.Engine(database_url, registry=reg) as engine:
        mixed(3, -1)
        engine.flush()
        before = engine.client.db.counters.statements
        mixed(200, -1)
        engine.flush()
        used = engine.client.db.counters.statements - before
    assert used < 200 / 2  # many records share one statement and one commit


def test_engine_default_mode_and_bad_mode(database_url: str) -> None:
    from durable import errors

    with pytest.raises(errors.ConfigurationError, match="'sync', 'async' or 'exit'"):
        durable.Engine(database_url, durability="sometimes")  # type: ignore[arg-type]
    reg, mixed, _ = app(None)
    with durable.Engine(database_url, registry=reg, durability="exit") as engine:
        engine.start(mixed, 5, -1, workflow_id="d").result(timeout=10)
        assert engine.get_workflow("d").durability == "exit"


@pytest.mark.parametrize("mode", ["async", "exit"])
def test_batched_records_keep_awkward_payloads_byte_for_byte(database_url: str, mode: str) -> None:
    """Lazy modes write many records in one statement (binary arrays): outputs full of
    quotes, backslashes, braces, commas, the word NULL and non-ASCII, and a 1 MB one, read
    back exactly as the sync mode stores them."""
    reg = durable.Registry()
    awkward = ['a "quoted", {braced} \\ back\\slash', "NULL", "", "ünïcødé ✓", "x" * 1_000_000]

    @durable.step(registry=reg, name="echo")
    def echo(value: str) -> str:
        return value

    @durable.workflow(registry=reg, name="echoes", durability=mode)  # type: ignore[arg-type]
    def echoes() -> list[str]:
        return [echo(v) for v in awkward]

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(echoes, workflow_id="awkward").result(timeout=30) == awkward
        stored = [engine.client.serializer.loads(r.output) for r in engine.steps("awkward")]
    assert stored == awkward


def _records(workflow_id: str, size: int) -> list[dict[str, Any]]:
    """Three step records of one run (epoch 2), each with an output of about `size` bytes."""
    import datetime as dt

    now = dt.datetime.now(dt.UTC)
    return [
        {
            "workflow_id": workflow_id,
            "epoch": 2,
            "step_seq": seq,
            "step_name": "s",
            "kind": "step",
            "output": '"' + "y" * size + '"',
            "error": None,
            "attempts": 1,
            "child_workflow_id": None,
            "started_at": now,
        }
        for seq in range(3)
    ]


def _two_runs(database_url: str) -> None:
    """'owned' is run at epoch 2; 'taken' was claimed since (epoch 3)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, owner, epoch)"
            " VALUES ('owned', 'x', 'RUNNING', '[]', 'me', 2),"
            " ('taken', 'x', 'RUNNING', '[]', 'other', 3)"
        )


@pytest.mark.parametrize("size", [10, 50_000])
def test_a_batch_of_records_says_whose_rows_the_fence_refused(database_url: str, size: int) -> None:
    """Small records go as one statement over arrays, large ones as a pipeline of fenced
    single-row inserts in one transaction: either way a run that lost its epoch has its
    rows refused and named, and the others are written."""
    with durable.Client(database_url, migrate=True) as client:
        _two_runs(database_url)
        rows = _records("owned", size) + _records("taken", size)
        assert client.db.write_steps(None, rows) == ["owned"] * 3
        assert [r.step_seq for r in client.steps("owned")] == [0, 1, 2]
        assert client.steps("taken") == []


@pytest.mark.parametrize("size", [10, 50_000])
def test_an_exit_mode_finish_writes_records_and_outcome_together_or_not_at_all(
    database_url: str, size: int
) -> None:
    def outcome(wid: str) -> dict[str, Any]:
        return {"workflow_id": wid, "epoch": 2, "status": "SUCCESS", "output": "7", "error": None}

    with durable.Client(database_url, migrate=True) as client:
        _two_runs(database_url)
        written = client.db.write_steps(None, _records("owned", size), outcome("owned"))
        assert written == ["owned"] * 3
        assert client.db.write_steps(None, _records("taken", size), outcome("taken")) == []
        assert client.get_workflow("owned").status == durable.WorkflowStatus.SUCCESS
        assert [r.step_seq for r in client.steps("owned")] == [0, 1, 2]
        assert client.get_workflow("taken").status == durable.WorkflowStatus.RUNNING
        assert client.steps("taken") == []
