"""Outcomes of runs that finish together share one statement and one commit, each still
fenced by its own run's epoch."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

import durable


@contextlib.contextmanager
def running(database_url: str, n: int) -> Iterator[durable.Client]:
    """A client, and workflows f0..f{n-1} RUNNING under epoch 1 (as if a worker ran them)."""
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="noop")
    def noop() -> None:
        return None

    with durable.Client(database_url) as client:
        for i in range(n):
            client.submit(noop, workflow_id=f"f{i}")
        with psycopg.connect(database_url, autocommit=True) as setup:
            setup.execute(
                "UPDATE durable.workflows SET status = 'RUNNING', owner = 'x', epoch = 1,"
                " lease_expires_at = now() + interval '1 hour'"
            )
        yield client


def test_finishes_queued_behind_a_write_go_in_one_statement(database_url: str) -> None:
    with running(database_url, 9) as client:
        db = client.db
        params = [
            {
                "workflow_id": f"f{i}",
                "epoch": 2 if i == 7 else 1,  # f7: a stale run, refused by the fence
                "status": "SUCCESS",
                "output": f'"{i}"',
                "error": None,
            }
            for i in range(9)
        ]
        results: dict[int, Any] = {}
        # Each run has its connection already (as runs do), autocommit like the pool's.
        conns = [psycopg.connect(database_url, autocommit=True) for _ in range(9)]

        def finish(i: int) -> None:
            results[i] = db.finishes.finish(conns[i], params[i])

        with psycopg.connect(database_url) as blocker:
            # Hold f0's row: the first finish (f0's) waits on it while the others queue.
            blocker.execute("SELECT 1 FROM durable.workflows WHERE workflow_id = 'f0' FOR UPDATE")
            first = threading.Thread(target=finish, args=(0,))
            first.start()
            time.sleep(0.3)
            before = db.counters.statements
            others = [threading.Thread(target=finish, args=(i,)) for i in range(1, 9)]
            for t in others:
                t.start()
            time.sleep(0.3)
            blocker.rollback()
        for t in [first, *others]:
            t.join(10)
        for c in conns:
            c.close()
        assert results == {i: 0 if i == 7 else 1 for i in range(9)}
        # f0's own statement (counted when it returned), then one for the eight that queued
        # behind it.
        assert db.counters.statements - before == 2
        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                "SELECT workflow_id, status, output FROM durable.workflows ORDER BY 1"
            ).fetchall()
        assert rows == [
            (f"f{i}", "RUNNING" if i == 7 else "SUCCESS", None if i == 7 else f'"{i}"')
            for i in range(9)
        ]


def step_params(i: int, seq: int, epoch: int = 1) -> dict[str, Any]:
    return {
        "workflow_id": f"f{i}",
        "epoch": epoch,
        "step_seq": seq,
        "step_name": "s",
        "kind": "step",
        "output": f'"{i}-{seq}"',
        "error": None,
        "attempts": 1,
        "child_workflow_id": None,
        "started_at": None,
    }


def test_step_records_queued_behind_a_write_share_one_statement(database_url: str) -> None:
    with running(database_url, 9) as client:
        db = client.db
        # f7: a zombie of an older epoch, refused by its fence; f3 twice (its owner and a
        # zombie): they go in separate statements, so each gets its own answer.
        writes = [step_params(i, 1, epoch=0 if i == 7 else 1) for i in range(9)]
        writes.append(step_params(3, 2, epoch=0))
        results: dict[int, Any] = {}
        conns = [psycopg.connect(database_url, autocommit=True) for _ in writes]

        def record(k: int) -> None:
            results[k] = db.records.record(conns[k], writes[k])

        with psycopg.connect(database_url) as blocker:
            # Hold f0's row: f0's record waits on it while the others queue behind it.
            blocker.execute("SELECT 1 FROM durable.workflows WHERE workflow_id = 'f0' FOR UPDATE")
            first = threading.Thread(target=record, args=(0,))
            first.start()
            time.sleep(0.3)
            before = db.counters.statements
            others = [threading.Thread(target=record, args=(k,)) for k in range(1, len(writes))]
            for t in others:
                t.start()
            time.sleep(0.3)
            blocker.rollback()
        for t in [first, *others]:
            t.join(10)
        for c in conns:
            c.close()
        assert results == {k: 0 if k in (7, 9) else 1 for k in range(len(writes))}
        # f0's own statement, one for the eight workflows queued behind it, and one for
        # f3's second write.
        assert db.counters.statements - before == 3
        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                "SELECT workflow_id, step_seq, output FROM durable.steps ORDER BY 1, 2"
            ).fetchall()
        assert rows == [(f"f{i}", 1, f'"{i}-1"') for i in range(9) if i != 7]


def test_a_record_the_database_refuses_does_not_fail_the_others(database_url: str) -> None:
    with running(database_url, 4) as client:
        db = client.db
        with psycopg.connect(database_url, autocommit=True) as setup:
            # f2's step 1 is already journaled: its record breaks the batch's statement.
            setup.execute(
                "INSERT INTO durable.steps (workflow_id, step_seq, step_name, kind, output,"
                " attempts) VALUES ('f2', 1, 's', 'step', '\"old\"', 1)"
            )
        writes = [step_params(i, 1) for i in range(4)]
        results: dict[int, Any] = {}
        conns = [psycopg.connect(database_url, autocommit=True) for _ in writes]

        def record(k: int) -> None:
            try:
                results[k] = db.records.record(conns[k], writes[k])
            except Exception as exc:
                results[k] = type(exc).__name__

        with psycopg.connect(database_url) as blocker:
            blocker.execute("SELECT 1 FROM durable.workflows WHERE workflow_id = 'f0' FOR UPDATE")
            threads = [threading.Thread(target=record, args=(k,)) for k in range(4)]
            threads[0].start()
            time.sleep(0.3)
            for t in threads[1:]:
                t.start()
            time.sleep(0.3)
            blocker.rollback()
        for t in threads:
            t.join(10)
        for c in conns:
            c.close()
        assert results[0] == results[1] == results[3] == 1
        assert isinstance(results[2], str)  # its own error, alone
        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                "SELECT workflow_id, output FROM durable.steps ORDER BY 1"
            ).fetchall()
        assert rows == [("f0", '"0-1"'), ("f1", '"1-1"'), ("f2", '"old"'), ("f3", '"3-1"')]


def test_a_leader_whose_connection_dies_hands_its_queue_on(database_url: str) -> None:
    # The leader's own write fails because its connection died: the writes queued behind it
    # go out on the next writer's connection, not on the dead one (which would fail them
    # all as an outage that is not one).
    with running(database_url, 5) as client:
        db = client.db
        writes = [step_params(i, 1) for i in range(5)]
        results: dict[int, Any] = {}
        conns = [psycopg.connect(database_url, autocommit=True) for _ in writes]

        def record(k: int) -> None:
            try:
                results[k] = db.records.record(conns[k], writes[k])
            except Exception as exc:
                results[k] = type(exc).__name__

        with psycopg.connect(database_url, autocommit=True) as blocker:
            blocker.execute("BEGIN")
            blocker.execute("SELECT 1 FROM durable.workflows WHERE workflow_id = 'f0' FOR UPDATE")
            threads = [threading.Thread(target=record, args=(k,)) for k in range(5)]
            threads[0].start()
            time.sleep(0.3)
            for t in threads[1:]:
                t.start()
            time.sleep(0.3)
            blocker.execute(
                "SELECT pg_terminate_backend(%s)", [conns[0].info.backend_pid]
            )  # the leader's connection dies under its write
            for t in threads:
                t.join(10)
            blocker.execute("ROLLBACK")
        for c in conns:
            c.close()
        assert results[0] == "DatabaseUnavailableError"
        assert [results[k] for k in range(1, 5)] == [1, 1, 1, 1]
        with psycopg.connect(database_url) as conn:
            rows = conn.execute("SELECT workflow_id FROM durable.steps ORDER BY 1").fetchall()
        assert rows == [(f"f{i}",) for i in range(1, 5)]
