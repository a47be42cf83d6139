"""A real engine runs workflows end to end on a Citus cluster (tests/citus.py), the schema
distributed as `durable migrate --citus` leaves it.

One workflow does a bit of everything a run does: steps, a @transaction that writes the
application's table (distributed by the workflow's id and colocated with durable's tables,
so that its rows and the step's journal row commit on one shard), an effect on a fake
vendor, a message it waits for, an approval, an event. Others cover the async driver,
durability="async" (batches of records of many runs), a queue with a global concurrency
limit, a partitioned queue, and a long sleep on a fake clock. Each checks what happened in
the world (the vendor's calls, the application's rows), not log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

import durable
from tests.integration.test_queue_partitions import run_backlog
from tests.integration.test_queue_routing import run_keys_over_their_rate, run_routed_engines

pytestmark = pytest.mark.citus


class Vendor:
    """A payment vendor that records every call it gets (keys deduplicated, as a real one)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.paid: dict[str, int] = {}

    def pay(self, key: str, cents: int) -> int:
        with self.lock:
            self.calls.append(key)
            return self.paid.setdefault(key, cents)


@pytest.fixture
def orders_table(citus_url: str) -> str:
    """The application's table, distributed by workflow id with durable's tables."""
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE paid_orders (order_id text PRIMARY KEY, cents integer NOT NULL)")
        conn.execute(
            "SELECT create_distributed_table('paid_orders', 'order_id',"
            " colocate_with => 'durable.workflows')"
        )
    return citus_url


def test_workflows_run_end_to_end_on_the_cluster(orders_table: str) -> None:
    url = orders_table
    reg = durable.Registry()
    vendor = Vendor()

    @durable.step(registry=reg)
    def price(order_id: str) -> int:
        return 4000 + len(order_id)

    @durable.transaction(registry=reg)
    def record(conn: Any, order_id: str, cents: int) -> int:
        conn.execute(
            text("INSERT INTO paid_orders (order_id, cents) VALUES (:o, :c)"),
            {"o": order_id, "c": cents},
        )
        return cents

    @durable.effect(registry=reg, idempotent=True)
    def charge(order_id: str, cents: int, *, idempotency_key: str) -> int:
        return vendor.pay(idempotency_key, cents)

    @durable.workflow(registry=reg)
    def order(order_id: str) -> dict[str, Any]:
        cents = price(order_id)
        go = durable.recv("go", timeout=120)
        decision = durable.approval("ship", {"cents": cents}, timeout=120)
        if go != "yes" or not decision.approved:
            return {"shipped": False}
        charged = charge(order_id, cents)
        durable.set_event("charged", charged)
        return {"shipped": True, "recorded": record(order_id, cents), "charged": charged}

    with durable.Engine(url, registry=reg, worker=True, poll_interval=0.1) as engine:
        handles = [engine.submit(order, f"o-{i}", workflow_id=f"o-{i}") for i in range(4)]
        for h in handles:
            wait_status(h, "SUSPENDED")
            engine.send(h.workflow_id, "yes", topic="go")
        for h in handles:
            wait_gate(engine, h.workflow_id, "ship")
            engine.decide(h.workflow_id, "ship", True, decided_by="test")
        results = [h.result(timeout=60) for h in handles]
        events = [engine.get_event(h.workflow_id, "charged") for h in handles]

    assert [r["shipped"] for r in results] == [True] * 4
    assert [r["recorded"] for r in results] == [4003] * 4
    assert events == [4003] * 4
    assert sorted(vendor.calls) == sorted(set(vendor.calls)) and len(vendor.calls) == 4
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT order_id, cents FROM paid_orders ORDER BY 1").fetchall()
        effects = conn.execute("SELECT status FROM durable.effects").fetchall()
    assert rows == [(f"o-{i}", 4003) for i in range(4)]
    assert effects == [("applied",)] * 4


# Where a @transaction's table lives on a cluster, and how Citus commits a step into it
# with the step's journal row (on the workflow's shard): see docs/scaling.md.
LAYOUTS = {
    # On the workflow's shard: one commit on one worker.
    "colocated": "SELECT create_distributed_table('ledger', 'workflow_id',"
    " colocate_with => 'durable.workflows')",
    # A copy on every node: a two-phase commit over them all.
    "reference": "SELECT create_reference_table('ledger')",
    # On the coordinator, known to Citus: a two-phase commit with the journal's worker.
    "citus_local": "SELECT citus_add_local_table_to_metadata('ledger')",
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_transaction_commits_with_its_journal_row_in_each_layout(
    citus_url: str, layout: str
) -> None:
    """Each @transaction step's row is written once, whichever layout holds the table: a
    step whose code fails after its INSERT rolls it back with the journal row (and runs
    again), and a step that committed is not run again. (What each layout costs in
    two-phase commits is counted by benchmarks/citus.py, whose smoke test checks it: the
    count needs a cluster-wide setting this shared cluster must not get.)"""
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE ledger (workflow_id text NOT NULL, i integer NOT NULL,"
            " PRIMARY KEY (workflow_id, i))"
        )
        conn.execute(LAYOUTS[layout])
    reg = durable.Registry()
    failed: set[tuple[str, int]] = set()

    @durable.transaction(registry=reg)
    def book(conn: Any, key: str, i: int, fail: bool) -> int:
        conn.execute(
            text("INSERT INTO ledger (workflow_id, i) VALUES (:w, :i)"), {"w": key, "i": i}
        )
        if fail:
            failed.add((key, i))
            raise RuntimeError("after the insert")
        return i

    @durable.workflow(registry=reg)
    def books(key: str, n: int) -> int:
        total = 0
        for i in range(n):
            with contextlib.suppress(RuntimeError):
                book(key, i, True)  # rolled back with its journal row's transaction
            total += book(key, i, False)
        return total

    with durable.Engine(citus_url, registry=reg) as engine:
        results = [
            engine.start(books, f"k{j}", 3, workflow_id=f"k{j}").result(timeout=60)
            for j in range(4)
        ]
        # Replayed from the journal: no step runs again.
        again = engine.start(books, "k0", 3, workflow_id="k0").result(timeout=60)
    assert results == [3] * 4 and again == 3
    with psycopg.connect(citus_url) as conn:
        rows = conn.execute("SELECT workflow_id, i FROM ledger ORDER BY 1, 2").fetchall()
    assert rows == [(f"k{j}", i) for j in range(4) for i in range(3)]
    assert failed == {(f"k{j}", i) for j in range(4) for i in range(3)}


def test_async_workflows_and_batched_records_on_the_cluster(citus_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    @durable.workflow(registry=reg)
    async def doubles(n: int) -> list[int]:
        return list(await asyncio.gather(*(double(i) for i in range(n))))

    @durable.step(registry=reg)
    def inc(x: int) -> int:
        return x + 1

    @durable.workflow(registry=reg, durability="async")
    def counts(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    with durable.Engine(citus_url, registry=reg, worker=True, poll_interval=0.1) as engine:
        asyncs = [engine.submit(doubles, 5, workflow_id=f"a-{i}") for i in range(3)]
        lazies = [engine.submit(counts, 20, workflow_id=f"c-{i}") for i in range(6)]
        assert [h.result(timeout=60) for h in asyncs] == [[0, 2, 4, 6, 8]] * 3
        assert [h.result(timeout=60) for h in lazies] == [20] * 6
        journals = {h.workflow_id: len(engine.steps(h.workflow_id)) for h in lazies}
    assert journals == {f"c-{i}": 20 for i in range(6)}


def test_a_queue_holds_its_concurrency_on_the_cluster(citus_url: str) -> None:
    reg = durable.Registry()
    queue = durable.Queue("reports", concurrency=2, registry=reg)
    lock = threading.Lock()
    running: list[int] = [0]
    most: list[int] = [0]

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
    def report(i: int) -> int:
        return work(i)

    with durable.Engine(citus_url, registry=reg, worker=True, poll_interval=0.1) as engine:
        handles = [engine.enqueue(queue, report, i) for i in range(10)]
        assert sorted(h.result(timeout=60) for h in handles) == list(range(10))
    assert 1 <= most[0] <= 2


def test_a_partitioned_queue_holds_its_limits_on_the_cluster(citus_url: str) -> None:
    """Each partition at most its limit, the queue at most its own (the backlog and checks
    of tests/integration/test_queue_partitions.py, on the distributed schema)."""
    tracker = run_backlog(citus_url)
    assert tracker.most["a"] == 2 and tracker.most["*"] <= 4
    assert tracker.most["b"] <= 2 and tracker.most["c"] <= 2


def test_a_per_key_rate_limit_holds_on_the_cluster(citus_url: str) -> None:
    """A key over its rate is passed over until a period has passed (the scenario of
    tests/integration/test_queue_routing.py, on the distributed schema; the count of a
    key's starts reads the worker nodes' clocks, so the period is real)."""
    run_keys_over_their_rate(citus_url, period=3.0, fake=False)


def test_a_routed_engine_runs_only_its_queues_on_the_cluster(citus_url: str) -> None:
    """An engine given queues runs only theirs, and work from no queue."""
    run_routed_engines(citus_url)


def test_a_long_sleep_on_a_fake_clock_on_the_cluster(citus_url: str) -> None:
    reg = durable.Registry()
    clock = durable.FakeClock(dt.datetime(2031, 1, 1, tzinfo=dt.UTC))

    @durable.workflow(registry=reg)
    def nap() -> str:
        durable.sleep(dt.timedelta(days=2))
        return "awake"

    with durable.Engine(
        citus_url, registry=reg, worker=True, poll_interval=0.1, clock=clock
    ) as engine:
        handle = engine.submit(nap, workflow_id="nap")
        wait_status(handle, "SUSPENDED")
        wake_at = engine.get_workflow("nap")
        clock.advance(dt.timedelta(days=2, seconds=1))
        assert handle.result(timeout=60) == "awake"
    with psycopg.connect(citus_url) as conn:
        row = conn.execute(
            "SELECT created_at, finished_at FROM durable.workflows WHERE workflow_id = 'nap'"
        ).fetchone()
    assert row is not None and wake_at is not None
    # Both on the engine's clock (in 2031), two days apart.
    assert row[0].year == 2031 and row[1] - row[0] >= dt.timedelta(days=2)


def wait_status(handle: durable.WorkflowHandle, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while handle.status() != status:
        if time.monotonic() > deadline:
            raise AssertionError(f"{handle.workflow_id} is {handle.status()}, not {status}")
        time.sleep(0.05)


def wait_gate(engine: durable.Engine, workflow_id: str, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(g["name"] == name for g in engine.list_approvals(workflow_id=workflow_id)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no gate {name} in {workflow_id}")
        time.sleep(0.05)


def test_a_cancel_and_a_timeout_stop_workflow_trees_on_the_cluster(citus_url: str) -> None:
    # A cancel walked the tree with a recursive query over parent_id, which Citus refuses
    # on a table sharded by workflow id: cancels and timeouts failed.
    reg = durable.Registry()

    @durable.workflow(registry=reg)
    def waiter(i: int) -> str:
        return str(durable.recv("never", timeout=600))

    @durable.workflow(registry=reg)
    def parent(n: int) -> list[str]:
        return [waiter(i) for i in range(n)]

    @durable.workflow(registry=reg, timeout=1)
    def slow() -> str:
        durable.sleep(60)
        return "late"

    with durable.Engine(citus_url, registry=reg, worker=True, poll_interval=0.1) as engine:
        tree = engine.submit(parent, 2, workflow_id="tree")
        deadline = time.monotonic() + 60
        while not [w for w in engine.list_workflows() if w.parent_id == "tree"]:
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        child = next(w for w in engine.list_workflows() if w.parent_id == "tree")
        wait_status(engine.retrieve(child.workflow_id), "SUSPENDED")
        engine.cancel("tree")
        with pytest.raises(durable.errors.WorkflowCancelledError):
            tree.result(timeout=60)
        assert engine.get_workflow(child.workflow_id).status == "CANCELLED"
        timed = engine.submit(slow)
        with pytest.raises(durable.errors.WorkflowTimeoutError):
            timed.result(timeout=60)
