"""One Citus worker node down (its postmaster SIGKILLed) is not the system database lost.

The coordinator still answers: a statement over every shard is refused (Citus cannot reach
the dead node's shards), but a workflow's statements on the other node's shards run. The
engine must not take that refusal for an outage of the whole database (dropping every
pooled connection and interrupting every run in flight), only fail the one statement as
unavailable, so that its caller retries it later.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest

import durable
from durable.errors import DatabaseUnavailableError
from tests import citus

pytestmark = pytest.mark.citus


def test_a_worker_node_down_fails_only_the_statements_that_need_it(
    citus_cluster: citus.CitusCluster, citus_url: str
) -> None:
    killed = 0
    with psycopg.connect(citus_url) as conn:
        rows = conn.execute(
            "SELECT w, p.nodeport FROM unnest(%s::text[]) AS w JOIN pg_dist_shard_placement p"
            " ON p.shardid = get_shard_id_for_distribution_column('durable.workflows', w)",
            [[f"w{i}" for i in range(40)]],
        ).fetchall()
    alive = next(w for w, port in rows if port != citus_cluster.workers[killed].port)
    dead = next(w for w, port in rows if port == citus_cluster.workers[killed].port)
    with durable.Client(citus_url) as client:
        db = client.db
        assert db.fetch_one("get_workflow_status", {"workflow_id": alive}) is None
        citus_cluster.kill_worker(killed)
        try:
            # Over several shards, the dead node's among them: refused, as unavailable
            # (retried later, not failed).
            with pytest.raises(DatabaseUnavailableError, match="worker node"):
                db.fetch_all("finished_among", {"workflow_ids": [alive, dead]})
            # On the dead node's shard: the same.
            with pytest.raises(DatabaseUnavailableError):
                db.fetch_one("get_workflow_status", {"workflow_id": dead})
            # Not an outage of the system database: nothing reported lost...
            assert db.outage.down_since is None
            # ...and the other node's shards answer, on the same pool.
            for _ in range(3):
                assert db.fetch_one("get_workflow_status", {"workflow_id": alive}) is None
            assert db.outage.down_since is None
        finally:
            with contextlib.suppress(Exception):
                citus_cluster.start_worker(killed)
        assert db.fetch_one("get_workflow_status", {"workflow_id": dead}) is None


def _placed(url: str, ids: list[str], port: int) -> tuple[list[str], list[str]]:
    """`ids` split into (on the node at `port`, on the others)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT w, p.nodeport FROM unnest(%s::text[]) AS w JOIN pg_dist_shard_placement p"
            " ON p.shardid = get_shard_id_for_distribution_column('durable.workflows', w)",
            [ids],
        ).fetchall()
    ports = dict(rows)
    return [w for w in ids if ports[w] == port], [w for w in ids if ports[w] != port]


def test_with_a_node_down_the_other_nodes_work_is_woken_claimed_and_renewed(
    citus_cluster: citus.CitusCluster, citus_url: str
) -> None:
    """A claim, a wake-up of due sleepers and a lease renewal each touched every shard, so
    one node down refused them whole and the other node's work stopped with it. Now a
    claim round (which wakes the sleepers of the shards it reads) reads one shard at a time
    and passes over those of the dead node, and a renewal is narrowed to the nodes that
    answer: the other node's workflows are claimed, woken and renewed, the dead node's
    wait for it."""
    killed = 0
    port = citus_cluster.workers[killed].port
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.executors (executor_id, hostname, pid, started_at,"
            " heartbeat_at, capabilities, incarnation)"
            " VALUES ('me', 'h', 1, now(), now(), '{}', 'i1')"
        )
        for i in range(24):
            # Half pending, half asleep and due.
            status, wake = ("PENDING", None) if i % 2 == 0 else ("SUSPENDED", "-infinity")
            conn.execute(
                "INSERT INTO durable.workflows (workflow_id, name, status, inputs, wake_at)"
                " VALUES (%s, 'job', %s, '[]', %s)",
                [f"w{i}", status, wake],
            )
    pending, asleep = [f"w{i}" for i in range(0, 24, 2)], [f"w{i}" for i in range(1, 24, 2)]
    pending_dead, pending_live = _placed(citus_url, pending, port)
    asleep_dead, asleep_live = _placed(citus_url, asleep, port)
    assert pending_dead and pending_live and asleep_dead and asleep_live
    claim = {
        "workflow_ids": None,
        "owner": "me",
        "incarnation": "i1",
        "lease_seconds": 30.0,
        "max_attempts": 10,
        "names": ["job"],
        "versions": [""],
        "journal_version": 1,
        "limit": 100,
    }
    with durable.Client(citus_url) as client:
        db = client.db
        citus_cluster.kill_worker(killed)
        try:
            claimed = {r["workflow_id"]: r["epoch"] for r in db.claim_batch(claim)}
            assert set(claimed) == set(pending_live) | set(asleep_live)
            # A limit is the oldest first, over the shards that answered.
            few = db.claim_batch({**claim, "limit": 1})
            assert few == []  # all of the live node's are taken
            # Leases: those on the live node renewed, the statement says not all reached.
            held = {**claimed, **dict.fromkeys(pending_dead, 0)}
            params = {
                "owner": "me",
                "incarnation": "i1",
                "held": list(held),
                "epochs": list(held.values()),
                "lease_seconds": 600.0,
            }
            renewed, reached = db.on_held("renew_leases", params, "count")
            assert (renewed, reached) == (len(claimed), False)
            rows, reached = db.on_held("owned_cancel_requests", params)
            assert (rows, reached) == ([], False)
            assert db.outage.down_since is None
        finally:
            with contextlib.suppress(Exception):
                citus_cluster.start_worker(killed)
        # The dead node's wait for it: pending and asleep as they were, then claimed.
        with psycopg.connect(citus_url) as conn:
            states = dict(
                conn.execute(
                    "SELECT workflow_id, status FROM durable.workflows WHERE workflow_id = ANY(%s)",
                    [pending_dead + asleep_dead],
                ).fetchall()
            )
            leases = conn.execute(
                "SELECT min(lease_expires_at - now()) FROM durable.workflows"
                " WHERE workflow_id = ANY(%s)",
                [list(claimed)],
            ).fetchone()
        assert states == {
            **dict.fromkeys(pending_dead, "PENDING"),
            **dict.fromkeys(asleep_dead, "SUSPENDED"),
        }
        assert leases is not None and leases[0].total_seconds() > 60
        rest = {r["workflow_id"] for r in db.claim_batch(claim)}
        assert rest == set(pending_dead) | set(asleep_dead)


def test_with_a_node_down_a_queue_without_limits_goes_on_and_one_with_limits_waits(
    citus_cluster: citus.CitusCluster, citus_url: str
) -> None:
    """A dequeue reads one shard at a time, so the entries on the nodes that answer are
    taken while one node is down; a queue with a concurrency limit counts its entries on
    every node, so it waits for the node (its limit holds), and the next queue goes on."""
    killed = 0
    port = citus_cluster.workers[killed].port
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.executors (executor_id, hostname, pid, started_at,"
            " heartbeat_at, capabilities, incarnation)"
            " VALUES ('me', 'h', 1, now(), now(), '{}', 'i1')"
        )
        for queue in ("capped", "free"):
            conn.execute(
                "INSERT INTO durable.workflows (workflow_id, name, status, inputs, queue_name)"
                " SELECT %s || g, 'job', 'ENQUEUED', '[]', %s FROM generate_series(0, 23) g",
                [f"{queue}-", queue],
            )
    free_dead, free_live = _placed(citus_url, [f"free-{i}" for i in range(24)], port)
    assert free_dead and free_live
    queue = {
        "workflow_ids": None,
        "owner": "me",
        "incarnation": "i1",
        "lease_seconds": 30.0,
        "names": ["job"],
        "versions": [""],
        "journal_version": 1,
        "limit": 100,
        "lock_key": "durable.queue:capped",
        "worker_concurrency": None,
        "rate_count": None,
        "rate_period": 0.0,
        "by_priority": False,
        "partition_concurrency": None,
    }
    capped = {**queue, "queue_name": "capped", "concurrency": 50}
    free = {**queue, "queue_name": "free", "concurrency": None}
    with durable.Client(citus_url) as client:
        db = client.db
        citus_cluster.kill_worker(killed)
        try:
            assert db.dequeue(capped) == []
            taken = {r["workflow_id"] for r in db.dequeue(free)}
            assert taken == set(free_live)
            assert db.outage.down_since is None
        finally:
            with contextlib.suppress(Exception):
                citus_cluster.start_worker(killed)
        assert {r["workflow_id"] for r in db.dequeue(free)} == set(free_dead)
        assert len(db.dequeue(capped)) > 0
