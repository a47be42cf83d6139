"""The journal: statement counts, replay, retries, errors and the stored workflow."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, text

import durable
from durable import errors


def expire(url: str, workflow_id: str) -> None:
    """Make a finished workflow look interrupted: owned by a dead executor, lease expired."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable.workflows SET status = 'RUNNING', owner = 'dead', output = NULL,"
            " lease_expires_at = now() - interval '1 second' WHERE workflow_id = %s",
            [workflow_id],
        )


def snapshot(url: str, workflow_id: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        wf = conn.execute(
            "SELECT name, status, inputs, output, error, epoch FROM durable.workflows"
            " WHERE workflow_id = %s",
            [workflow_id],
        ).fetchone()
        steps = conn.execute(
            "SELECT step_seq, step_name, output, error, attempts FROM durable.steps"
            " WHERE workflow_id = %s ORDER BY step_seq",
            [workflow_id],
        ).fetchall()
    return wf, steps


def app() -> tuple[durable.Registry, Any, Any, list[int]]:
    reg = durable.Registry()
    runs: list[int] = []

    @durable.step(registry=reg, name="inc")
    def inc(i: int) -> int:
        runs.append(i)
        return i + 1

    @durable.workflow(registry=reg, name="loop")
    def loop(n: int) -> int:
        total = 0
        for i in range(n):
            total += inc(i)
        return total

    return reg, inc, loop, runs


@pytest.mark.parametrize("n", [10, 100])
def test_fresh_run_issues_one_statement_per_step(database_url: str, n: int) -> None:
    reg, _inc, loop, _runs = app()
    with durable.Engine(database_url, registry=reg) as engine:
        # The heartbeat reads cancel requests every half second while a run is in flight: on
        # a loaded machine one landed in every round. Slowed down, at most one more lands
        # (the wait under way), in one round.
        engine._services.heartbeat.cancel_poll_interval = 60.0
        loop(3)  # warm the pool and prepared statements
        costs = []
        for _ in range(3):
            before = engine.client.db.counters.statements
            assert loop(n) == sum(range(1, n + 1))
            costs.append(engine.client.db.counters.statements - before)
    # insert workflow + one per step + finish.
    assert min(costs) <= n + 2, costs


def test_replay_issues_constant_statements(database_url: str) -> None:
    reg, _inc, loop, runs = app()
    used = {}
    with durable.Engine(database_url, registry=reg) as engine:
        for n in (10, 100):
            engine.start(loop, n, workflow_id=f"r{n}").result(timeout=30)
            # The engine's heartbeat may add a statement to any window (it reads cancel
            # requests while a run is in flight), never take one away: the fewest of three
            # replays is the replay's own.
            costs = []
            for _ in range(3):
                expire(database_url, f"r{n}")
                runs.clear()
                before = engine.client.db.counters.statements
                (handle,) = engine.recover()
                assert handle.result(timeout=30) == sum(range(1, n + 1))
                costs.append(engine.client.db.counters.statements - before)
                assert runs == []  # nothing re-ran
            used[n] = min(costs)
    # claim + journal read + finish, plus the result poll: the same for 10 and 100 steps
    assert used[10] == used[100] <= 5


def test_nondeterminism_leaves_journal_intact(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg, name="a")
    def a() -> int:
        return 1

    @durable.step(registry=reg, name="b")
    def b() -> int:
        return 2

    flag = {"new_code": False}

    @durable.workflow(registry=reg, name="changing")
    def changing() -> int:
        return (b() if flag["new_code"] else a()) + a()

    with durable.Engine(database_url, registry=reg) as engine:
        engine.start(changing, workflow_id="nd").result(timeout=10)
        expire(database_url, "nd")
        _, steps_before = snapshot(database_url, "nd")
        flag["new_code"] = True
        (handle,) = engine.recover()
        with pytest.raises(errors.WorkflowFailedError) as info:
            handle.result(timeout=10)
        assert info.value.error_type == "durable.errors.NondeterminismError"
        assert "'a'" in info.value.error_message and "'b'" in info.value.error_message
        _, steps_after = snapshot(database_url, "nd")
        assert steps_after == steps_before


def test_retries_record_attempts_and_errors_replay(database_url: str) -> None:
    reg = durable.Registry()
    attempts: list[int] = []

    @durable.step(registry=reg, name="flaky", retries=3, initial_delay=0.01, jitter=0)
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("vendor down")
        return "ok"

    @durable.step(registry=reg, name="broken", retries=1, initial_delay=0, retry_on=KeyError)
    def broken() -> None:
        attempts.append(2)
        raise ValueError("bad order")

    @durable.workflow(registry=reg, name="retrying")
    def retrying() -> str:
        first = flaky()
        try:
            broken()
        except ValueError as exc:
            return f"{first}/{exc}"
        return "unreachable"

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(retrying, workflow_id="rt").result(timeout=10) == "ok/bad order"
        steps = engine.steps("rt")
        assert [s.attempts for s in steps] == [3, 1]  # ValueError is not in retry_on
        assert steps[1].error is not None and "bad order" in steps[1].error
        expire(database_url, "rt")
        attempts.clear()
        (handle,) = engine.recover()
        # The recorded ValueError is re-raised on replay, nothing runs again.
        assert handle.result(timeout=10) == "ok/bad order"
        assert attempts == []


def test_step_error_of_custom_type_replays_as_step_error(database_url: str) -> None:
    reg = durable.Registry()

    class VendorError(Exception):
        pass

    seen: list[BaseException] = []

    @durable.step(registry=reg, name="fails")
    def fails() -> None:
        raise VendorError("card declined")

    @durable.workflow(registry=reg, name="catches")
    def catches() -> str:
        try:
            fails()
        except Exception as exc:
            seen.append(exc)
            return type(exc).__name__
        return ""

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(catches, workflow_id="ce").result(timeout=10) == "VendorError"
        expire(database_url, "ce")
        # Recovered here, or, on a loaded machine, by the engine's own keeper first.
        handle = next(iter(engine.recover()), None) or engine.retrieve("ce")
        assert handle.result(timeout=10) == "StepError"
        err = seen[-1]
        assert isinstance(err, errors.StepError)
        assert err.error_type.endswith("VendorError") and err.error_message == "card declined"


def test_workflow_failure_is_stored(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="boom")
    def boom() -> None:
        raise RuntimeError("nope")

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(boom, workflow_id="boom")
        with pytest.raises(errors.WorkflowFailedError, match="nope"):
            handle.result(timeout=10)
        assert handle.status() == durable.WorkflowStatus.ERROR
        with pytest.raises(RuntimeError, match="nope"):
            boom()  # type: ignore[func-returns-value]


def test_serializer_round_trips_rich_values(database_url: str) -> None:
    reg = durable.Registry()

    @dataclasses.dataclass
    class Order:
        id: str
        cents: int

    value = {
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "day": dt.date(2026, 1, 2),
        "amount": decimal.Decimal("12.50"),
        "id": uuid.UUID(int=7),
        "order": {"id": "o1", "cents": 10},
    }

    @durable.step(registry=reg, name="rich")
    def rich() -> dict[str, Any]:
        return value

    @durable.workflow(registry=reg, name="rich_wf")
    def rich_wf() -> dict[str, Any]:
        return rich()

    # A dataclass inside a dict would come back as a dict after a restart: refused at the
    # call, unless the annotation says how to rebuild it.
    @durable.step(registry=reg, name="nested_dataclass")
    def nested() -> dict[str, Any]:
        return {"order": Order("o1", 10)}

    @durable.workflow(registry=reg, name="nested_wf")
    def nested_wf() -> dict[str, Any]:
        return nested()

    with durable.Engine(database_url, registry=reg) as engine:
        got = engine.start(rich_wf, workflow_id="rich").result(timeout=10)
        with pytest.raises(errors.WorkflowFailedError, match="nested_dataclass"):
            engine.start(nested_wf, workflow_id="nested").result(timeout=10)
        assert engine.steps("nested") == []
    assert got == value
    assert got["when"] == value["when"] and got["amount"] == decimal.Decimal("12.50")
    assert got["id"] == uuid.UUID(int=7) and got["day"] == dt.date(2026, 1, 2)


def test_child_workflows_have_deterministic_ids(database_url: str) -> None:
    reg, _inc, loop, runs = app()

    @durable.workflow(registry=reg, name="parent")
    def parent() -> int:
        a = loop(2)
        handle = durable_engine.start(loop, 3)
        return a + handle.result(timeout=10)

    with durable.Engine(database_url, registry=reg) as durable_engine:
        assert durable_engine.start(parent, workflow_id="p").result(timeout=20) == 3 + 6
        children = sorted(
            (w.workflow_id, w.parent_id) for w in durable_engine.list_workflows(name="loop")
        )
        assert children == [("p:child:0", "p"), ("p:child:1", "p")]
        kinds = [s.kind for s in durable_engine.steps("p")]
        assert kinds == ["child", "child"]
        expire(database_url, "p")
        runs.clear()
        (handle,) = durable_engine.recover()
        assert handle.result(timeout=20) == 9
        assert runs == []


def test_transaction_in_separate_app_database(database_url: str, bare_database_url: str) -> None:
    reg = durable.Registry()
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE payouts (id serial PRIMARY KEY, who text)")

    @durable.transaction(registry=reg, name="payout")
    def payout(conn: Connection, who: str) -> int:
        row = conn.execute(text("INSERT INTO payouts (who) VALUES (:w) RETURNING id"), {"w": who})
        return int(row.scalar_one())

    @durable.workflow(registry=reg, name="payouts")
    def payouts() -> list[int]:
        return [payout("ann"), payout("bob")]

    with durable.Engine(database_url, registry=reg, app_database_url=bare_database_url) as engine:
        assert engine.start(payouts, workflow_id="po").result(timeout=10) == [1, 2]
        # Simulate a crash after the app commit of step 1 but before the system journal row.
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM durable.steps WHERE workflow_id = 'po' AND step_seq = 1")
        expire(database_url, "po")
        (handle,) = engine.recover()
        assert handle.result(timeout=10) == [1, 2]
    with psycopg.connect(bare_database_url) as conn:
        assert conn.execute("SELECT count(*) FROM payouts").fetchone() == (2,)
        assert conn.execute(
            "SELECT count(*) FROM durable.transaction_outputs WHERE workflow_id = 'po'"
        ).fetchone() == (2,)


def test_stale_owner_transaction_rolls_back_its_app_write(database_url: str) -> None:
    reg = durable.Registry()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id serial PRIMARY KEY, what text)")

    @durable.transaction(registry=reg, name="write_ledger")
    def write_ledger(conn: Connection, what: str) -> str:
        conn.execute(text("INSERT INTO ledger (what) VALUES (:w)"), {"w": what})
        # Meanwhile another worker claims the workflow (this run's lease expired).
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute(
                "UPDATE durable.workflows SET epoch = epoch + 1, owner = 'other-worker'"
                " WHERE status = 'RUNNING'"
            )
        return what

    @durable.workflow(registry=reg, name="zombie_tx")
    def zombie_tx() -> str:
        return write_ledger("refund o1")

    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.StaleOwnerError):
            zombie_tx()
        (info,) = engine.list_workflows()
        assert engine.steps(info.workflow_id) == []
        assert info.status == "RUNNING" and info.owner == "other-worker"
    with psycopg.connect(database_url) as conn:
        # The zombie's app write rolled back with its journal row.
        assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (0,)


def test_every_kind_is_journaled_by_its_owner_and_a_stale_epoch_writes_nothing(
    database_url: str,
) -> None:
    """The journal has no CHECK on its rows (0041): every value durable writes goes in, by
    the single and the batched record statements, and the fence still keeps a run whose
    epoch is gone from writing anything."""
    from durable._base.models import StepKind
    from durable._io.runio_base import steps_params

    kinds = [k.value for k in StepKind]
    with durable.Client(database_url) as client:
        record_step = client.db.statement("record_step")
        record_steps = client.db.statement("record_steps")
        record_run_steps = client.db.statement("record_run_steps")
    now = dt.datetime.now(dt.UTC)

    def row(epoch: int, seq: int, kind: str) -> dict[str, Any]:
        return {
            "workflow_id": "owned",
            "epoch": epoch,
            "step_seq": seq,
            "step_name": f"s{seq}",
            "kind": kind,
            "output": None if seq % 2 else "1",
            "error": "{}" if seq % 2 else None,
            "attempts": 1 + seq % 3,
            "child_workflow_id": None,
            "started_at": now,
        }

    journal = "SELECT step_seq, kind FROM durable.steps WHERE workflow_id = 'owned' ORDER BY 1"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, inputs, status, owner, epoch)"
            " VALUES ('owned', 'wf', '[]', 'RUNNING', 'me', 2)"
        )
        n = len(kinds)
        for seq, kind in enumerate(kinds):
            # A zombie (epoch 1) writes nothing, in either form; the owner (epoch 2) writes.
            assert conn.execute(record_step, row(1, seq, kind)).fetchall() == []
            assert conn.execute(record_steps, steps_params([row(1, seq, kind)])).fetchall() == []
            assert conn.execute(record_step, row(2, seq, kind)).fetchall() == [("owned",)]
        batch = [row(2, n + seq, kind) for seq, kind in enumerate(kinds)]
        assert len(conn.execute(record_steps, steps_params(batch)).fetchall()) == n
        per_run = steps_params([row(2, 2 * n + seq, kind) for seq, kind in enumerate(kinds)])
        del per_run["workflow_ids"], per_run["epochs"]
        stale = {**per_run, "workflow_id": "owned", "epoch": 1}
        assert conn.execute(record_run_steps, stale).fetchall() == []
        written = conn.execute(record_run_steps, {**stale, "epoch": 2}).fetchall()
        assert len(written) == n
        assert conn.execute(journal).fetchall() == list(enumerate(kinds * 3))
