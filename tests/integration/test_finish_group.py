"""Outcomes of runs that finish together share one statement and one commit, each still
fenced by its own run's epoch."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

import durable


def test_finishes_queued_behind_a_write_go_in_one_statement(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="noop")
    def noop() -> None:
        return None

    with durable.Client(database_url) as client:
        for i in range(9):
            client.submit(noop, workflow_id=f"f{i}")
        db = client.db
        with psycopg.connect(database_url, autocommit=True) as setup:
            setup.execute(
                "UPDATE durable.workflows SET status = 'RUNNING', owner = 'x', epoch = 1,"
                " lease_expires_at = now() + interval '1 hour'"
            )
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
