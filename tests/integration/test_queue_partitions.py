"""Queue partitions: `enqueue(..., partition_key=user)` on a queue declared with
`partition_concurrency=N` runs at most N entries of one partition at once, the queue's own
limit still holding over all of them, and a full partition's backlog holds back no other
partition. (Across worker processes, with a SIGKILL: tests/acceptance/test_queue_partitions.py.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg
import pytest
from starlette.testclient import TestClient

import durable
from durable import errors
from durable.ui import create_app


@dataclass
class Tracker:
    """What ran, in this process: the most entries at once, per partition and in all."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    running: Counter[str] = field(default_factory=Counter)
    most: Counter[str] = field(default_factory=Counter)
    runs: Counter[str] = field(default_factory=Counter)
    order: list[str] = field(default_factory=list)

    def enter(self, partition: str, entry: str) -> None:
        with self.lock:
            self.runs[entry] += 1
            self.order.append(entry)
            for key in (partition, "*"):
                self.running[key] += 1
                self.most[key] = max(self.most[key], self.running[key])

    def leave(self, partition: str) -> None:
        with self.lock:
            for key in (partition, "*"):
                self.running[key] -= 1


def partitioned_app(
    tracker: Tracker, *, concurrency: int | None, partition_concurrency: int, seconds: float
) -> tuple[durable.Registry, durable.Queue, object]:
    reg = durable.Registry()
    queue = durable.Queue(
        "tenants",
        concurrency=concurrency,
        partition_concurrency=partition_concurrency,
        registry=reg,
    )

    @durable.step(registry=reg, name="work")
    def work(partition: str, entry: str) -> str:
        tracker.enter(partition, entry)
        try:
            time.sleep(seconds)
        finally:
            tracker.leave(partition)
        return entry

    @durable.workflow(registry=reg, name="job")
    def job(partition: str, entry: str) -> str:
        return work(partition, entry)

    return reg, queue, job


def enqueue_backlog(client: durable.Client, queue: durable.Queue, job: object) -> list[str]:
    """Six entries of partition a first (the oldest), then three each of b and c, then two
    without a partition: in plain queue order, a's backlog would take every slot first."""
    ids = []
    for partition, n in (("a", 6), ("b", 3), ("c", 3)):
        for i in range(n):
            entry = f"{partition}{i}"
            client.enqueue(queue, job, partition, entry, workflow_id=entry, partition_key=partition)
            ids.append(entry)
    for i in range(2):
        client.enqueue(queue, job, "-", f"n{i}", workflow_id=f"n{i}")
        ids.append(f"n{i}")
    return ids


def run_backlog(url: str) -> Tracker:
    """The backlog through one worker with more threads than the queue allows."""
    tracker = Tracker()
    reg, queue, job = partitioned_app(tracker, concurrency=4, partition_concurrency=2, seconds=0.15)
    with durable.Client(url) as client:
        ids = enqueue_backlog(client, queue, job)
    with psycopg.connect(url) as conn:
        stored: dict[str, str | None] = dict(
            conn.execute("SELECT workflow_id, partition_key FROM durable.workflows").fetchall()
        )
    assert stored == {i: (None if i.startswith("n") else i[0]) for i in ids}
    with durable.Engine(
        url, registry=reg, worker=True, poll_interval=0.02, max_workers=8
    ) as engine:
        assert sorted(engine.retrieve(i).result(timeout=60) for i in ids) == sorted(ids)
    assert tracker.runs == Counter({i: 1 for i in ids})
    return tracker


def test_each_partition_and_the_queue_hold_their_limits(database_url: str) -> None:
    tracker = run_backlog(database_url)
    # Partition a reached its limit of two and never passed it; nor did b or c; and the
    # queue's limit of four held over all partitions and the entries without one.
    assert tracker.most["a"] == 2
    assert tracker.most["b"] <= 2 and tracker.most["c"] <= 2
    assert tracker.most["*"] <= 4
    # a's backlog did not hold the others back: b and c started before a's last entries.
    order = tracker.order
    assert order.index("b0") < order.index("a5") and order.index("c0") < order.index("a5")


def test_partitions_hold_with_compare_and_set_claims(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same statement serves a distributed schema (DURABLE_CLAIMS=cas, as on Citus)."""
    monkeypatch.setenv("DURABLE_CLAIMS", "cas")
    tracker = run_backlog(database_url)
    assert tracker.most["a"] == 2 and tracker.most["*"] <= 4


def test_a_partition_limit_without_a_queue_limit(database_url: str) -> None:
    """partition_concurrency alone: each partition capped, the queue not."""
    tracker = Tracker()
    reg, queue, job = partitioned_app(
        tracker, concurrency=None, partition_concurrency=1, seconds=0.1
    )
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.02, max_workers=8
    ) as engine:
        handles = [
            engine.enqueue(queue, job, p, f"{p}{i}", partition_key=p)
            for i in range(3)
            for p in "abc"
        ]
        for h in handles:
            h.result(timeout=60)
    assert max(tracker.most[p] for p in "abc") == 1
    assert tracker.most["*"] >= 2  # partitions ran side by side


def test_enqueue_async_and_a_child_take_a_partition_key(database_url: str) -> None:
    tracker = Tracker()
    reg, queue, job = partitioned_app(tracker, concurrency=2, partition_concurrency=1, seconds=0.0)

    @durable.workflow(registry=reg, name="parent")
    def parent(user: str) -> str:
        handle = queue.enqueue(job, user, "child", workflow_id="child", partition_key=user)
        return str(handle.result())

    async def main() -> str:
        async with durable.Engine(
            database_url, registry=reg, worker=True, poll_interval=0.02
        ) as engine:
            handle = await engine.enqueue_async(queue, job, "u2", "async", partition_key="u2")
            assert await handle.result(timeout=60) == "async"
            started = engine.submit(parent, "u1", workflow_id="parent")
            return str(await asyncio.to_thread(started.result, 60))

    assert asyncio.run(main()) == "child"
    with psycopg.connect(database_url) as conn:
        keys: dict[str, str] = dict(
            conn.execute(
                "SELECT workflow_id, partition_key FROM durable.workflows"
                " WHERE queue_name IS NOT NULL"
            ).fetchall()
        )
    assert set(keys.values()) == {"u1", "u2"} and keys["child"] == "u1"


def test_misuse_is_refused_and_stores_nothing(database_url: str) -> None:
    reg = durable.Registry()
    plain = durable.Queue("plain", concurrency=2, registry=reg)
    parted = durable.Queue("parted", partition_concurrency=2, registry=reg)

    @durable.workflow(registry=reg, name="noop")
    def noop(x: int) -> int:
        return x

    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(errors.ConfigurationError, match="partition_concurrency"):
            durable.Queue(f"bad-{bad}", partition_concurrency=bad, registry=reg)
    with durable.Client(database_url) as client:
        # A key on a queue without a partition limit would cap nothing: refused, not ignored.
        with pytest.raises(errors.ConfigurationError, match="partition_concurrency=N"):
            client.enqueue(plain, noop, 1, partition_key="user-1")
        for key in ("", 42, "a\x00b", "x" * 600):
            with pytest.raises(errors.InvalidNameError, match="partition_key"):
                client.enqueue(parted, noop, 1, partition_key=key)
        assert client.list_workflows() == []
        # Without a key, an entry of a partitioned queue is in no partition.
        handle = client.enqueue(parted, noop, 7)
        assert handle.status() == "ENQUEUED"


def test_the_cli_and_the_console_list_a_queues_partitions(database_url: str) -> None:
    tracker = Tracker()
    _, queue, job = partitioned_app(tracker, concurrency=None, partition_concurrency=2, seconds=0)
    with durable.Client(database_url) as client:
        for entry, partition in (("x1", "acme"), ("x2", "acme"), ("y1", "globex"), ("z", None)):
            client.enqueue(queue, job, partition or "-", entry, partition_key=partition)
        assert client.queue_partitions("tenants") == [
            {"partition_key": "acme", "queued": 2, "active": 0},
            {"partition_key": "globex", "queued": 1, "active": 0},
        ]
    url = ["--database-url", database_url]
    listed = subprocess.run(
        [sys.executable, "-m", "durable.cli", "queues", "partitions", "tenants", "--json", *url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {"partition_key": "acme", "queued": 2, "active": 0},
        {"partition_key": "globex", "queued": 1, "active": 0},
    ]
    table = subprocess.run(
        [sys.executable, "-m", "durable.cli", "queues", "partitions", "tenants", *url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0, table.stderr
    assert "acme" in table.stdout and "globex" in table.stdout
    with durable.Client(database_url) as client:
        web = TestClient(create_app(client, read_only=True), base_url="http://127.0.0.1:8321")
        page = web.get("/queues")
    assert page.status_code == 200
    assert "Partitions" in page.text
    assert "<td>tenants</td><td>acme</td><td>2</td><td>0</td>" in page.text
