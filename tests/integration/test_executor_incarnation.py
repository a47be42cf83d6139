"""An executor id is held by one incarnation (one process) at a time: the executor row
names it, and every statement a process runs under its id (heartbeat, lease renewal,
cancel polling, claims, dequeues, releases, the row's deletion) acts only while the row
names that process's incarnation, checked inside the statement itself. A process paused
past its lease whose id another process took over, then resumed, touches nothing."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import durable
from durable._client.queues import Queue
from durable._io.systemdb import SystemDB
from durable.errors import ExecutorIdTakenError
from tests.acceptance.workers import wait_for

ID = "twin"


def register(db: SystemDB, incarnation: str, pid: int) -> None:
    db.execute("upsert_executor", registration(incarnation, pid))


def registration(incarnation: str, pid: int) -> dict[str, Any]:
    return {
        "executor_id": ID,
        "hostname": "host",
        "pid": pid,
        "capabilities": json.dumps([["x", None]]),
        "incarnation": incarnation,
        "host_key": "",
        "pid_start": None,
    }


def claim(db: SystemDB, incarnation: str) -> list[str]:
    rows = db.claim_batch(
        {
            "workflow_ids": None,
            "owner": ID,
            "incarnation": incarnation,
            "lease_seconds": 60.0,
            "max_attempts": 10,
            "names": ["x"],
            "versions": [""],
            "journal_version": 1,
            "limit": 1,
        }
    )
    return [r["workflow_id"] for r in rows]


def dequeue(db: SystemDB, incarnation: str) -> list[str]:
    reg = durable.Registry()
    queue = Queue("q", registry=reg)
    params = queue.dequeue_params(
        schema="durable", owner=ID, lease_seconds=60.0, defs=[], limit=5, only=None
    )
    params.update(names=["x"], versions=[""], incarnation=incarnation)
    return [r["workflow_id"] for r in db.dequeue(params)]


def held(incarnation: str, claims: dict[str, int]) -> dict[str, Any]:
    return {
        "owner": ID,
        "incarnation": incarnation,
        "held": list(claims),
        "epochs": list(claims.values()),
        "lease_seconds": 60.0,
    }


def epochs(url: str, *workflow_ids: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, epoch FROM durable.workflows WHERE workflow_id = ANY(%s)",
            [list(workflow_ids)],
        ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def row(url: str, query: str, *params: object) -> Any:
    with psycopg.connect(url) as conn:
        return conn.execute(query, list(params)).fetchone()


@pytest.mark.parametrize("claims", ["skip-locked", "cas"])
def test_a_stale_incarnation_touches_nothing_under_its_id(
    database_url: str, monkeypatch: pytest.MonkeyPatch, claims: str
) -> None:
    monkeypatch.setenv("DURABLE_CLAIMS", claims)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, created_at)"
            " SELECT 'w' || i, 'x', 'PENDING', '[]', now() + make_interval(secs => i)"
            " FROM generate_series(1, 3) AS i"
        )
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, queue_name)"
            " VALUES ('e1', 'x', 'ENQUEUED', '[]', 'q')"
        )
    with durable.Client(database_url) as client:
        db = client.db
        assert db.cas_claims == (claims == "cas")
        register(db, "a", 101)
        assert claim(db, "a") == ["w1"]  # A claims while it holds the id
        a_claims = {"w1": 1}
        # A is paused past its lease; B starts with A's id: B's incarnation holds it now.
        register(db, "b", 202)
        # A's claim still has a live lease (A claimed it after all): B leaves it to expire.
        assert db.execute("abandon_owned", {"owner": ID, "incarnation": "b", "dead": False}) == 0
        assert claim(db, "b") == ["w2"]
        b_claims = {"w2": 1}
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("UPDATE durable.workflows SET cancel_requested_at = now()")

        # A resumes: under the incarnation it started with, every statement is a no-op.
        assert claim(db, "a") == []
        assert dequeue(db, "a") == []
        assert (
            db.fetch_all(
                "owned_cancel_requests", {"owner": ID, "incarnation": "a", "held": ["w1", "w2"]}
            )
            == []
        )
        assert db.execute("renew_leases", held("a", a_claims)) == 0
        assert db.fetch_one("heartbeat_executor", registration("a", 101)) is None
        assert db.execute("abandon_owned", {"owner": ID, "incarnation": "a", "dead": True}) == 0
        # Its shutdown: what it would release under the id is B's, and the row is B's.
        assert db.execute("release_owned", held("a", {**a_claims, **b_claims})) == 0
        assert db.execute("delete_executor", {"executor_id": ID, "incarnation": "a"}) == 0
        assert row(database_url, "SELECT pid, incarnation FROM durable.executors") == (202, "b")
        assert row(
            database_url,
            "SELECT status, owner, epoch FROM durable.workflows WHERE workflow_id = 'w2'",
        ) == ("RUNNING", ID, 1)

        # B, the holder, does all of it; and only for its own claims (by epoch).
        requests = db.fetch_all(
            "owned_cancel_requests", {"owner": ID, "incarnation": "b", "held": ["w1", "w2"]}
        )
        assert sorted(r["workflow_id"] for r in requests) == ["w1", "w2"]
        assert db.fetch_one("heartbeat_executor", registration("b", 202)) is not None
        assert db.execute("renew_leases", held("b", b_claims)) == 1
        assert db.execute("renew_leases", held("b", {"w2": 7})) == 0  # not its claim
        assert dequeue(db, "b") == ["e1"]
        assert claim(db, "b") == ["w3"]
        mine = epochs(database_url, "w2", "w3", "e1")
        assert db.execute("release_owned", held("b", mine)) == 3
        # Had A been known dead, B would have taken its claim back at once.
        assert db.execute("abandon_owned", {"owner": ID, "incarnation": "b", "dead": True}) == 1
        assert db.execute("delete_executor", {"executor_id": ID, "incarnation": "b"}) == 1
        assert row(database_url, "SELECT count(*) FROM durable.executors") == (0,)


def test_a_heartbeat_registers_again_a_row_that_was_pruned(database_url: str) -> None:
    """A process silent for long may have had its row pruned: nobody else holds the id,
    so its next heartbeat registers it again (the id is still its own)."""
    with durable.Client(database_url) as client:
        db = client.db
        register(db, "a", 101)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM durable.executors")
        assert db.fetch_one("heartbeat_executor", registration("a", 101)) is not None
        assert row(database_url, "SELECT pid, incarnation FROM durable.executors") == (101, "a")


def test_an_engine_whose_id_is_taken_over_stops_and_leaves_the_holder_alone(
    database_url: str,
) -> None:
    reg = durable.Registry()
    ran: list[str] = []

    @durable.workflow(registry=reg, name="x")
    def x(key: str) -> str:
        ran.append(key)
        return key

    engine = durable.Engine(
        database_url, registry=reg, executor_id=ID, worker=True, lease_seconds=0.6
    )
    with engine:
        assert engine.start(x, "before").result(timeout=30) == "before"
        # Another process takes the id over (as after this one was paused past its lease).
        with durable.Client(database_url) as other:
            register(other.db, "newer", 303)
        wait_for(lambda: engine.ownership.superseded, what="the engine to find its id taken")
        with pytest.raises(ExecutorIdTakenError, match="taken over by pid 303 on host"):
            engine.start(x, "after")
        with durable.Client(database_url) as other:
            other.submit(x, "submitted", workflow_id="submitted")
    # Its shutdown released nothing and left the holder's row in place.
    assert row(database_url, "SELECT pid, incarnation FROM durable.executors") == (303, "newer")
    assert row(
        database_url, "SELECT status, owner FROM durable.workflows WHERE workflow_id = 'submitted'"
    ) == ("PENDING", None)
    assert ran == ["before"]
