"""Under SERIALIZABLE isolation (CockroachDB's only level) transactions that collide fail
with SQLSTATE 40001 and must be run again by their client; durable does, and nothing runs
twice. And a queue's dedup key is taken by exactly one of many concurrent enqueues."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from sqlalchemy import Connection, text

import durable
from durable import errors


def serializable(url: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_isolation = serializable')
        conn.execute("CREATE TABLE seats (workflow_id text PRIMARY KEY, taken int NOT NULL)")


def test_colliding_transaction_steps_are_retried_not_failed(database_url: str) -> None:
    serializable(database_url)
    reg = durable.Registry()
    both_read = threading.Barrier(2, timeout=5)
    attempts: list[str] = []

    @durable.transaction(registry=reg, name="take_seat")
    def take_seat(conn: Connection, who: str) -> int:
        attempts.append(who)
        taken = conn.execute(text("SELECT count(*) FROM seats")).scalar_one()
        try:
            both_read.wait()  # each has read what the other is about to change
        except threading.BrokenBarrierError:
            pass  # a retry runs alone
        conn.execute(text("INSERT INTO seats VALUES (:w, :n)"), {"w": who, "n": int(taken) + 1})
        return int(taken) + 1

    @durable.workflow(registry=reg, name="book")
    def book(who: str) -> int:
        return take_seat(who)

    with durable.Engine(database_url, registry=reg, max_workers=2) as engine:
        with psycopg.connect(database_url) as conn:
            level = conn.execute("SHOW transaction_isolation").fetchone()
        assert level == ("serializable",)
        a = engine.start(book, "a", workflow_id="a")
        b = engine.start(book, "b", workflow_id="b")
        assert sorted([a.result(timeout=30), b.result(timeout=30)]) == [1, 2]
        steps = engine.steps("a") + engine.steps("b")
    # When the two overlapped, one collided with the other, rolled back whole and ran again
    # (under load they may not overlap, or collide more than once): both took a seat.
    assert set(attempts) == {"a", "b"}
    assert [s.step_name for s in steps] == ["take_seat", "take_seat"]
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM seats").fetchone() == (2,)


def test_a_conflict_that_keeps_coming_back_fails_the_step_after_the_retries(
    database_url: str,
) -> None:
    serializable(database_url)
    reg = durable.Registry()
    attempts: list[int] = []

    @durable.transaction(registry=reg, name="always_collides")
    def always_collides(conn: Connection) -> int:
        attempts.append(1)
        conn.execute(text("SELECT 1"))
        raise_conflict = "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001'; END $$"
        conn.execute(text(raise_conflict))
        return 0

    @durable.workflow(registry=reg, name="doomed")
    def doomed() -> int:
        return always_collides()

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(doomed, workflow_id="doomed")
        with pytest.raises(Exception, match=r"40001|could not serialize|raise_exception"):
            handle.result(timeout=30)
    assert len(attempts) == 10  # CONFLICT_ATTEMPTS, then the error is the step's outcome


def test_one_of_many_concurrent_enqueues_takes_a_dedup_key(database_url: str) -> None:
    reg = durable.Registry()
    queue = durable.Queue("reports", registry=reg)

    @durable.workflow(registry=reg, name="report")
    def report(n: int) -> int:
        return n

    start = threading.Barrier(8)

    def enqueue(i: int) -> str:
        start.wait()
        try:
            return client.enqueue(queue, report, i, dedup_key="daily").workflow_id
        except errors.QueueDedupError as exc:
            return f"refused:{exc.workflow_id}"

    with durable.Client(database_url) as client, ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(enqueue, range(8)))
    winners = [o for o in outcomes if not o.startswith("refused:")]
    assert len(winners) == 1
    assert all(o == f"refused:{winners[0]}" for o in outcomes if o not in winners)
    with psycopg.connect(database_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM durable.workflows WHERE queue_name = 'reports'"
        ).fetchone() == (1,)
