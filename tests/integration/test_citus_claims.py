"""On Citus a claim round reads a bounded part of `workflows`, whatever the shard count.

A claim (with the wake-up of the sleepers that are due) and a dequeue, as the engine sends
them on a distributed schema, with the commands Citus sends to the worker nodes for them
logged (citus.log_remote_commands): the shards those commands touch are counted, on a
database of 8 shards and on one of 32. A statement over the whole table would touch every
shard; a round must touch at most `shards.PER_ROUND` of them on both. And the rounds go
round: every shard's work is taken in the end.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import durable
from durable._io import shards
from durable._io.systemdb import SystemDB
from tests.citus import CitusCluster, with_dbname

pytestmark = pytest.mark.citus

OWNER = "exec-claims"
CLAIM = {
    "owner": OWNER,
    "incarnation": "i1",
    "lease_seconds": 30.0,
    "max_attempts": 10,
    "workflow_ids": None,
    "names": ["wf"],
    "versions": [""],
    "journal_version": 1,
    "queues": None,
}
QUEUE = {
    **CLAIM,
    "queue_name": "q",
    "lock_key": "durable.queue:q",
    "concurrency": None,
    "worker_concurrency": None,
    "rate_count": None,
    "rate_period": 0.0,
    "by_priority": False,
    "partition_concurrency": None,
}


@pytest.fixture(scope="module", params=[8, 32], ids=["8-shards", "32-shards"])
def sharded(request: pytest.FixtureRequest, citus_cluster: CitusCluster) -> Iterator[str]:
    """A migrated, distributed database of 8 (then 32) shards per table, with 20 runnable
    workflows, 20 sleepers that are due and 20 queue entries per shard (on average)."""
    before = citus_cluster.shard_count
    citus_cluster.shard_count = request.param
    try:
        url = citus_cluster.create_database()
    finally:
        citus_cluster.shard_count = before
    with durable.Client(url, migrate=True) as client:
        client.distribute_citus()
    n = 20 * request.param
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.executors (executor_id, hostname, pid, started_at,"
            " heartbeat_at, incarnation) VALUES (%s, 'h', 1, now(), now(), 'i1')",
            [OWNER],
        )
        for prefix, status, extra in (
            ("p", "PENDING", ""),
            ("s", "SUSPENDED", ", wake_at"),
            ("e", "ENQUEUED", ", queue_name"),
        ):
            value = {"": "", ", wake_at": ", now() - interval '1 s'", ", queue_name": ", 'q'"}
            conn.execute(
                "INSERT INTO durable.workflows (workflow_id, name, status, inputs"
                f"{extra}) SELECT %s || g, 'wf', %s, '[]'{value[extra]}"
                " FROM generate_series(1, %s) AS g",
                [f"{prefix}-", status, n],
            )
    yield url
    citus_cluster.drop_database(url)


def touched(db: SystemDB, work: Any) -> tuple[Any, set[str]]:
    """What `work()` returned, and the hash ranges of the shards of the commands Citus sent
    to the worker nodes meanwhile (named in them, or named by the key of a call routed to
    the node holding its shard). `db` has one connection: the one logged."""
    sent: list[str] = []

    def log(diag: psycopg.errors.Diagnostic) -> None:
        sent.append(diag.message_primary or "")

    with db.connection() as conn:
        conn.add_notice_handler(log)
        conn.execute("SET citus.log_remote_commands = on")
    try:
        result = work()
    finally:
        with db.connection() as conn:
            conn.execute("SET citus.log_remote_commands = off")
            conn.remove_notice_handler(log)
    with db.connection() as conn:
        issued = [m for m in sent if m.startswith("issuing ")]
        ids = {int(i) for m in issued for i in re.findall(r"durable\.[a-z_]+_(\d+)", m)}
        keys = [k for m in issued for k in re.findall(r"_on_shard\('([^']*)'", m)]
        for key in keys:
            row = conn.execute(
                "SELECT get_shard_id_for_distribution_column('durable.workflows', %s::text)",
                [key],
            ).fetchone()
            assert row is not None
            ids.add(int(row[0]))
        rows = conn.execute(
            "SELECT DISTINCT shardminvalue FROM pg_dist_shard"
            " WHERE shardid = ANY(%s) AND shardminvalue IS NOT NULL",
            [list(ids)],
        ).fetchall()
    assert issued, "no command was logged"
    return result, {str(r[0]) for r in rows}


@pytest.fixture
def db(sharded: str) -> Iterator[SystemDB]:
    """The engine's database handle, on one connection (whose commands are logged)."""
    handle = SystemDB(sharded, "durable", min_size=1, max_size=1)
    handle.open()
    yield handle
    handle.close()


def test_a_claim_round_reads_a_bounded_number_of_shards(db: SystemDB) -> None:
    assert db.distributed and db.cas_claims
    for _ in range(3):  # rounds that claim, and that wake sleepers on their shards
        claimed, ranges = touched(db, lambda: db.claim_batch({**CLAIM, "limit": 5}))
        assert len(claimed) == 5
        assert 0 < len(ranges) <= shards.PER_ROUND, ranges
    claimed, ranges = touched(db, lambda: db.claim_batch({**CLAIM, "limit": 10_000}))
    assert len(claimed) > 5
    assert 0 < len(ranges) <= shards.PER_ROUND, ranges
    with db.connection() as conn:
        woken = conn.execute(
            "SELECT count(*) FROM durable.workflows WHERE workflow_id LIKE 's-%'"
            " AND status <> 'SUSPENDED'"
        ).fetchone()
    assert woken is not None and woken[0] > 0


def test_a_dequeue_reads_a_bounded_number_of_shards(db: SystemDB) -> None:
    taken, ranges = touched(db, lambda: db.dequeue({**QUEUE, "limit": 5}))
    assert len(taken) == 5
    assert 0 < len(ranges) <= shards.PER_ROUND, ranges


def test_the_rounds_take_the_work_of_every_shard(db: SystemDB, sharded: str) -> None:
    with psycopg.connect(sharded, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'durable.workflows'::regclass"
        ).fetchone()
    assert row is not None
    for _ in range(4 * int(row[0])):
        db.claim_batch({**CLAIM, "limit": 50})
        db.dequeue({**QUEUE, "limit": 50})
    with psycopg.connect(sharded, autocommit=True) as conn:
        rest = conn.execute(
            "SELECT status, count(*) FROM durable.workflows WHERE status IN ('ENQUEUED',"
            " 'PENDING', 'SUSPENDED') GROUP BY status"
        ).fetchall()
    assert rest == []


def test_workers_connected_to_worker_nodes_hold_a_queues_limit(
    citus_cluster: CitusCluster, sharded: str
) -> None:
    """A worker may connect to any node of the cluster: two engines, each on a worker node
    (not the coordinator), run a queue's entries, and its concurrency holds across them
    (its lock is a row on one shard, the same from either node)."""
    dbname = psycopg.conninfo.conninfo_to_dict(sharded)["dbname"]
    urls = [with_dbname(node.url(), str(dbname)) for node in citus_cluster.workers]
    reg = durable.Registry()
    queue = durable.Queue("spread", concurrency=2, registry=reg)
    lock = threading.Lock()
    running = [0]
    most = [0]

    @durable.step(registry=reg)
    def work(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return i

    @durable.workflow(registry=reg)
    def job(i: int) -> int:
        return work(i)

    with contextlib.ExitStack() as stack:
        engines = [
            stack.enter_context(durable.Engine(url, registry=reg, worker=True, poll_interval=0.05))
            for url in urls
        ]
        handles = [engines[i % 2].enqueue(queue, job, i) for i in range(12)]
        assert sorted(h.result(timeout=60) for h in handles) == list(range(12))
    assert 1 <= most[0] <= 2
