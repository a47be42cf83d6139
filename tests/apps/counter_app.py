"""A small app for crash tests: every step call is recorded in the `world` table.

The `world` table is written through its own autocommit connection, outside durable, so it
shows what really happened (including step runs whose journal write never committed).

Usage: python -m tests.apps.counter_app (run|recover) DATABASE_URL WORKFLOW_ID [N_STEPS]
Crash points are armed with DURABLE_CRASH_POINTS (see Engine.crash_point).
DURABLE_TEST_DRIVER=async runs the `async def` twins; `run` then starts them with
`async with Engine` / `await engine.start_async(...)`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import psycopg
from sqlalchemy import Connection, text

import durable
from tests.apps import vendor

registry = durable.Registry()
WORLD_DDL = """
CREATE TABLE IF NOT EXISTS world (id bigserial PRIMARY KEY, workflow_id text, what text,
    pid int, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS refunds (id bigserial PRIMARY KEY, order_id text, cents int);
CREATE TABLE IF NOT EXISTS marks (workflow_id text, i int, UNIQUE (workflow_id, i));
CREATE TABLE IF NOT EXISTS queue_runs (id bigserial PRIMARY KEY, workflow_id text,
    pid int, started_at timestamptz NOT NULL, finished_at timestamptz);
"""


class World:
    url: str = ""

    @classmethod
    def record(cls, workflow_id: str, what: str) -> None:
        url = cls.url or os.environ["DURABLE_DATABASE_URL"]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO world (workflow_id, what, pid) VALUES (%s, %s, %s)",
                [workflow_id, what, os.getpid()],
            )


@durable.step(registry=registry, name="counter.step")
def count_step(workflow_id: str, label: str) -> str:
    World.record(workflow_id, label)
    return label.upper()


@durable.transaction(registry=registry, name="counter.refund")
def record_refund(conn: Connection, workflow_id: str, order_id: str, cents: int) -> int:
    World.record(workflow_id, f"refund-attempt:{order_id}")
    conn.execute(
        text("INSERT INTO refunds (order_id, cents) VALUES (:o, :c)"), {"o": order_id, "c": cents}
    )
    return cents


@durable.workflow(registry=registry, name="counter.three_steps")
def three_steps(workflow_id: str, /) -> list[str]:
    return [count_step(workflow_id, f"s{i}") for i in (1, 2, 3)]


@durable.workflow(registry=registry, name="counter.refunds")
def refunds(workflow_id: str, /, orders: list[list[object]]) -> int:
    total = 0
    for order_id, cents in orders:
        total += record_refund(workflow_id, str(order_id), int(str(cents)))
        count_step(workflow_id, f"after:{order_id}")
    return total


# Retries transient failures of its own connection (e.g. while PostgreSQL restarts).
@durable.step(
    registry=registry,
    name="counter.slow_step",
    retries=30,
    initial_delay=0.2,
    max_delay=1.0,
    retry_on=psycopg.OperationalError,
)
def slow_step(workflow_id: str, label: str, seconds: float) -> str:
    time.sleep(seconds)
    World.record(workflow_id, label)
    return label


@durable.workflow(registry=registry, name="counter.slow")
def slow(workflow_id: str, /, n: int, seconds: float) -> list[str]:
    return [slow_step(workflow_id, f"s{i}", seconds) for i in range(n)]


@durable.transaction(registry=registry, name="counter.mark")
def mark(conn: Connection, workflow_id: str, i: int) -> int:
    # UNIQUE (workflow_id, i): a transaction step that ran twice would fail here.
    conn.execute(
        text("INSERT INTO marks (workflow_id, i) VALUES (:w, :i)"), {"w": workflow_id, "i": i}
    )
    return i


@durable.step(registry=registry, name="counter.pure")
def pure(i: int) -> int:
    return i * i


@durable.workflow(registry=registry, name="counter.load")
def load(workflow_id: str, /, n: int) -> int:
    total = 0
    for i in range(n):
        total += mark(workflow_id, i) if i % 2 == 0 else pure(i)
    return total


def lookup_refund(idempotency_key: str, order_id: str, cents: int) -> dict[str, object] | None:
    return vendor.lookup(idempotency_key)


# A vendor that does NOT deduplicate keys: only reconciliation keeps a resume from paying twice.
@durable.effect(registry=registry, name="counter.refund_reconciled", reconcile=lookup_refund)
def refund_reconciled(order_id: str, cents: int, *, idempotency_key: str) -> dict[str, object]:
    return vendor.refund(order_id, cents, idempotency_key, dedup=False)


# A vendor that deduplicates keys: re-calling with the same key is harmless.
@durable.effect(registry=registry, name="counter.refund_idempotent", idempotent=True)
def refund_idempotent(order_id: str, cents: int, *, idempotency_key: str) -> dict[str, object]:
    return vendor.refund(order_id, cents, idempotency_key, dedup=True)


@durable.workflow(registry=registry, name="counter.pay")
def pay(mode: str, amounts: list[int]) -> int:
    effect = refund_reconciled if mode == "reconcile" else refund_idempotent
    return sum(int(str(effect(f"o{i}", c)["cents"])) for i, c in enumerate(amounts, 1))


@durable.effect(registry=registry, name="counter.book", idempotent=True)
def book(item: str, cents: int, *, idempotency_key: str) -> dict[str, object]:
    return vendor.refund(item, cents, idempotency_key, dedup=True)


@durable.effect(registry=registry, name="counter.unbook", idempotent=True)
def unbook(item: str, cents: int, *, idempotency_key: str) -> dict[str, object]:
    return vendor.refund(item, -cents, idempotency_key, dedup=True)


book.compensation(unbook)  # type: ignore[attr-defined]


@durable.effect(registry=registry, name="counter.charge_card", idempotent=True)
def charge_card(cents: int, *, idempotency_key: str) -> None:
    raise ValueError("card declined")


@durable.workflow(registry=registry, name="counter.trip")
def trip() -> str:
    book("flight", 10)
    book("hotel", 25)
    charge_card(35)
    return "booked"


@durable.workflow(registry=registry, name="counter.booked_trip")
def booked_trip() -> str:
    """Books a flight and a hotel (each undone by its compensation), then waits for a
    verdict: "fail" fails it."""
    book("flight", 10)
    book("hotel", 25)
    if durable.recv("verdict", timeout=3600) == "fail":
        raise ValueError("no visa")
    return "booked"


@durable.workflow(registry=registry, name="counter.big_refund")
def big_refund(cents: int, timeout: float | None, /) -> str:
    count_step("big", "before-gate")
    decision = durable.approval(
        "refund-over-limit", payload={"cents": cents}, timeout=timeout, default=False
    )
    if not decision.approved:
        return f"not refunded ({'timed out' if decision.timed_out else decision.comment})"
    refund_idempotent("big", cents)
    return f"refunded {cents} ({decision.comment})"


EFFECTS_AT = (10, 25, 40)


@durable.step(registry=registry, name="counter.pure_step")
def pure_step(workflow_id: str, i: int) -> int:
    World.record(workflow_id, f"p{i}")
    return i


def _fifty(workflow_id: str) -> int:
    total = 0
    for i in range(50):
        if i in EFFECTS_AT:
            total += int(str(refund_idempotent(f"e{i}", i)["cents"]))
        else:
            total += pure_step(workflow_id, i)
    return total


@durable.workflow(registry=registry, name="counter.fifty_sync", durability="sync")
def fifty_sync(workflow_id: str, /) -> int:
    return _fifty(workflow_id)


@durable.workflow(registry=registry, name="counter.fifty_async", durability="async")
def fifty_async(workflow_id: str, /) -> int:
    return _fifty(workflow_id)


@durable.workflow(registry=registry, name="counter.fifty_exit", durability="exit")
def fifty_exit(workflow_id: str, /) -> int:
    return _fifty(workflow_id)


@durable.workflow(registry=registry, name="counter.napper")
def napper(workflow_id: str, /, seconds: float) -> str:
    count_step(workflow_id, "before")
    durable.sleep(seconds)
    return count_step(workflow_id, "after")


@durable.workflow(registry=registry, name="counter.ticker")
def ticker(tick: object) -> str:
    """Run by a schedule: records the tick it was started for."""
    World.record("ticker", str(tick))
    return str(tick)


@durable.workflow(registry=registry, name="counter.receiver")
def receiver(workflow_id: str, /, n: int) -> list[object]:
    got = []
    for _ in range(n):
        message = durable.recv("orders", timeout=30)
        count_step(workflow_id, f"got:{message}")
        got.append(message)
    return got


@durable.workflow(registry=registry, name="counter.many")
def many(workflow_id: str, /, n: int) -> int:
    for i in range(n):
        count_step(workflow_id, f"s{i}")
    return n


# Declared in code like workflows: every worker importing this app dequeues from them.
limited = durable.Queue("counter.limited", concurrency=2, registry=registry)
throttled = durable.Queue("counter.throttled", rate_limit=(3, 2.0), registry=registry)
ranked = durable.Queue("counter.ranked", concurrency=1, priority=True, registry=registry)


@durable.step(registry=registry, name="counter.occupy")
def occupy(workflow_id: str, seconds: float) -> str:
    """Record, in the world, when this entry ran (the database's clock, for every process)."""
    url = World.url or os.environ["DURABLE_DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO queue_runs (workflow_id, pid, started_at)"
            " VALUES (%s, %s, clock_timestamp()) RETURNING id",
            [workflow_id, os.getpid()],
        ).fetchone()
        assert row is not None
        time.sleep(seconds)
        conn.execute("UPDATE queue_runs SET finished_at = clock_timestamp() WHERE id = %s", row)
    return workflow_id


@durable.workflow(registry=registry, name="counter.queued")
def queued(workflow_id: str, /, seconds: float) -> str:
    return occupy(workflow_id, seconds)


@durable.workflow(registry=registry, name="counter.long_trip")
def long_trip(workflow_id: str, /, n: int, pause: float) -> str:
    """Books a flight (undone by its compensation), then works for a long time."""
    book("flight", 10)
    for i in range(n):
        slow_step(workflow_id, f"work{i}", pause)
    return "done"


@durable.workflow(registry=registry, name="counter.tree")
def tree(workflow_id: str, /, n: int, pause: float) -> str:
    """Books a hotel, then runs long_trip as a child: cancelling this cancels both."""
    book("hotel", 25)
    long_trip(f"{workflow_id}/child", n, pause)
    return "done"


@durable.workflow(registry=registry, name="counter.booked_nap")
def booked_nap(workflow_id: str, /, seconds: float) -> str:
    book("car", 7)
    durable.sleep(seconds)
    return count_step(workflow_id, "after")


@durable.workflow(registry=registry, name="counter.booked_wait")
def booked_wait(workflow_id: str, /) -> str:
    """Books a car (undone by its compensation), waits for "go", then ships."""
    book("car", 7)
    durable.recv("go", timeout=3600)
    return count_step(workflow_id, "ship")


@durable.workflow(registry=registry, name="counter.deadline_nap", timeout=3600)
def deadline_nap(workflow_id: str, /, seconds: float) -> str:
    """Sleeps longer than its one-hour timeout allows."""
    count_step(workflow_id, "before")
    durable.sleep(seconds)
    return count_step(workflow_id, "after")


@durable.step(registry=registry, name="counter.spend")
def spend(workflow_id: str, i: int) -> int:
    """An LLM-like call: costs (i + 1) quarters and 10 * (i + 1) tokens."""
    World.record(workflow_id, f"spend:{i}")
    durable.charge(dollars=(i + 1) * 0.25, tokens=10 * (i + 1))
    return i


@durable.workflow(
    registry=registry,
    name="counter.spender",
    budget=durable.Budget(dollars=100.0, tokens=1_000_000),
)
def spender(workflow_id: str, /, n: int) -> int:
    return sum(spend(workflow_id, i) for i in range(n))


# -- the same workflows as `async def`, run by the async driver ----------------------------------
# Distinct names, one registry: a worker loading this app runs both kinds. `ASYNC[name]` is
# the async twin of a workflow above.


@durable.step(registry=registry, name="counter.step.async")
async def count_step_async(workflow_id: str, label: str) -> str:
    World.record(workflow_id, label)
    return label.upper()


@durable.workflow(registry=registry, name="counter.three_steps.async")
async def three_steps_async(workflow_id: str, /) -> list[str]:
    return [await count_step_async(workflow_id, f"s{i}") for i in (1, 2, 3)]


@durable.transaction(registry=registry, name="counter.refund.async")
async def record_refund_async(conn: Any, workflow_id: str, order_id: str, cents: int) -> int:
    World.record(workflow_id, f"refund-attempt:{order_id}")
    await conn.execute(
        text("INSERT INTO refunds (order_id, cents) VALUES (:o, :c)"), {"o": order_id, "c": cents}
    )
    return cents


@durable.workflow(registry=registry, name="counter.refunds.async")
async def refunds_async(workflow_id: str, /, orders: list[list[object]]) -> int:
    total = 0
    for order_id, cents in orders:
        total += await record_refund_async(workflow_id, str(order_id), int(str(cents)))
        await count_step_async(workflow_id, f"after:{order_id}")
    return total


@durable.effect(registry=registry, name="counter.refund_reconciled.async", reconcile=lookup_refund)
async def refund_reconciled_async(
    order_id: str, cents: int, *, idempotency_key: str
) -> dict[str, object]:
    return vendor.refund(order_id, cents, idempotency_key, dedup=False)


@durable.effect(registry=registry, name="counter.refund_idempotent.async", idempotent=True)
async def refund_idempotent_async(
    order_id: str, cents: int, *, idempotency_key: str
) -> dict[str, object]:
    return vendor.refund(order_id, cents, idempotency_key, dedup=True)


@durable.workflow(registry=registry, name="counter.pay.async")
async def pay_async(mode: str, amounts: list[int]) -> int:
    effect = refund_reconciled_async if mode == "reconcile" else refund_idempotent_async
    total = 0
    for i, c in enumerate(amounts, 1):
        total += int(str((await effect(f"o{i}", c))["cents"]))
    return total


@durable.step(registry=registry, name="counter.pure_step.async")
async def pure_step_async(workflow_id: str, i: int) -> int:
    World.record(workflow_id, f"p{i}")
    return i


async def _fifty_async(workflow_id: str) -> int:
    total = 0
    for i in range(50):
        if i in EFFECTS_AT:
            total += int(str((await refund_idempotent_async(f"e{i}", i))["cents"]))
        else:
            total += await pure_step_async(workflow_id, i)
    return total


@durable.workflow(registry=registry, name="counter.fifty_sync.async", durability="sync")
async def fifty_sync_async(workflow_id: str, /) -> int:
    return await _fifty_async(workflow_id)


@durable.workflow(registry=registry, name="counter.fifty_async.async", durability="async")
async def fifty_async_async(workflow_id: str, /) -> int:
    return await _fifty_async(workflow_id)


@durable.workflow(registry=registry, name="counter.fifty_exit.async", durability="exit")
async def fifty_exit_async(workflow_id: str, /) -> int:
    return await _fifty_async(workflow_id)


@durable.workflow(registry=registry, name="counter.napper.async")
async def napper_async(workflow_id: str, /, seconds: float) -> str:
    await count_step_async(workflow_id, "before")
    await durable.sleep_async(seconds)
    return await count_step_async(workflow_id, "after")


@durable.workflow(registry=registry, name="counter.receiver.async")
async def receiver_async(workflow_id: str, /, n: int) -> list[object]:
    got = []
    for _ in range(n):
        message = await durable.recv_async("orders", timeout=30)
        await count_step_async(workflow_id, f"got:{message}")
        got.append(message)
    return got


@durable.step(registry=registry, name="counter.spend.async")
async def spend_async(workflow_id: str, i: int) -> int:
    World.record(workflow_id, f"spend:{i}")
    durable.charge(dollars=(i + 1) * 0.25, tokens=10 * (i + 1))
    return i


@durable.workflow(
    registry=registry,
    name="counter.spender.async",
    budget=durable.Budget(dollars=100.0, tokens=1_000_000),
)
async def spender_async(workflow_id: str, /, n: int) -> int:
    return sum([await spend_async(workflow_id, i) for i in range(n)])


@durable.step(registry=registry, name="counter.slow_step.async", retries=30, initial_delay=0.2)
async def slow_step_async(workflow_id: str, label: str, seconds: float) -> str:
    await asyncio.sleep(seconds)
    World.record(workflow_id, label)
    return label


@durable.workflow(registry=registry, name="counter.slow.async")
async def slow_async(workflow_id: str, /, n: int, seconds: float) -> list[str]:
    return [await slow_step_async(workflow_id, f"s{i}", seconds) for i in range(n)]


@durable.effect(registry=registry, name="counter.book.async", idempotent=True)
async def book_async(item: str, cents: int, *, idempotency_key: str) -> dict[str, object]:
    return vendor.refund(item, cents, idempotency_key, dedup=True)


@durable.effect(registry=registry, name="counter.unbook.async", idempotent=True)
async def unbook_async(item: str, cents: int, *, idempotency_key: str) -> dict[str, object]:
    return vendor.refund(item, -cents, idempotency_key, dedup=True)


book_async.compensation(unbook_async)  # type: ignore[attr-defined]


@durable.workflow(registry=registry, name="counter.long_trip.async")
async def long_trip_async(workflow_id: str, /, n: int, pause: float) -> str:
    await book_async("flight", 10)
    for i in range(n):
        await slow_step_async(workflow_id, f"work{i}", pause)
    return "done"


@durable.workflow(registry=registry, name="counter.tree.async")
async def tree_async(workflow_id: str, /, n: int, pause: float) -> str:
    await book_async("hotel", 25)
    await long_trip_async(f"{workflow_id}/child", n, pause)
    return "done"


@durable.workflow(registry=registry, name="counter.booked_nap.async")
async def booked_nap_async(workflow_id: str, /, seconds: float) -> str:
    await book_async("car", 7)
    await durable.sleep_async(seconds)
    return await count_step_async(workflow_id, "after")


@durable.workflow(registry=registry, name="counter.booked_wait.async")
async def booked_wait_async(workflow_id: str, /) -> str:
    await book_async("car", 7)
    await durable.recv_async("go", timeout=3600)
    return await count_step_async(workflow_id, "ship")


@durable.effect(registry=registry, name="counter.charge_card.async", idempotent=True)
async def charge_card_async(cents: int, *, idempotency_key: str) -> None:
    raise ValueError("card declined")


@durable.workflow(registry=registry, name="counter.trip.async")
async def trip_async() -> str:
    await book_async("flight", 10)
    await book_async("hotel", 25)
    await charge_card_async(35)
    return "booked"


@durable.workflow(registry=registry, name="counter.deadline_nap.async", timeout=3600)
async def deadline_nap_async(workflow_id: str, /, seconds: float) -> str:
    await count_step_async(workflow_id, "before")
    await durable.sleep_async(seconds)
    return await count_step_async(workflow_id, "after")


@durable.workflow(registry=registry, name="counter.queued.async")
async def queued_async(workflow_id: str, /, seconds: float) -> str:
    return await durable.to_thread(occupy, workflow_id, seconds)


@durable.workflow(registry=registry, name="counter.big_refund.async")
async def big_refund_async(cents: int, timeout: float | None, /) -> str:
    await count_step_async("big", "before-gate")
    decision = await durable.approval_async(
        "refund-over-limit", payload={"cents": cents}, timeout=timeout, default=False
    )
    if not decision.approved:
        return f"not refunded ({'timed out' if decision.timed_out else decision.comment})"
    await refund_idempotent_async("big", cents)
    return f"refunded {cents} ({decision.comment})"


ASYNC: dict[object, object] = {
    three_steps: three_steps_async,
    slow: slow_async,
    refunds: refunds_async,
    pay: pay_async,
    fifty_sync: fifty_sync_async,
    fifty_async: fifty_async_async,
    fifty_exit: fifty_exit_async,
    napper: napper_async,
    receiver: receiver_async,
    spender: spender_async,
    long_trip: long_trip_async,
    tree: tree_async,
    booked_nap: booked_nap_async,
    booked_wait: booked_wait_async,
    trip: trip_async,
    deadline_nap: deadline_nap_async,
    queued: queued_async,
    big_refund: big_refund_async,
}


def pick(workflow: Any, driver: str) -> Any:
    """The workflow itself ("sync") or its `async def` twin ("async")."""
    return ASYNC[workflow] if driver == "async" else workflow


def setup(url: str) -> None:
    World.url = url
    vendor.setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(WORLD_DDL)


async def run_async(url: str, workflow_id: str, which: str) -> int:
    """`run` for the async driver: started and awaited on this loop, as an async app does."""
    async with durable.Engine(url, registry=registry, lease_seconds=1.0) as engine:
        if which == "three":
            handle = await engine.start_async(
                three_steps_async, workflow_id, workflow_id=workflow_id
            )
        elif which == "refunds":
            orders = [["o1", 10], ["o2", 25], ["o3", 40]]
            handle = await engine.start_async(
                refunds_async, workflow_id, orders, workflow_id=workflow_id
            )
        else:
            raise SystemExit(f"no async twin for {which!r}")
        print(json.dumps(await handle.result(timeout=60)))
    return 0


def main(argv: list[str]) -> int:
    mode, url, workflow_id = argv[0], argv[1], argv[2]
    which = argv[3] if len(argv) > 3 else "three"
    driver = os.environ.get("DURABLE_TEST_DRIVER", "sync")
    setup(url)
    if mode == "run" and driver == "async":
        return asyncio.run(run_async(url, workflow_id, which))
    with durable.Engine(url, registry=registry, lease_seconds=1.0) as engine:
        if mode == "run":
            if which == "three":
                wf = pick(three_steps, driver)
                handle = engine.start(wf, workflow_id, workflow_id=workflow_id)
            elif which == "refunds":
                orders = [["o1", 10], ["o2", 25], ["o3", 40]]
                wf = pick(refunds, driver)
                handle = engine.start(wf, workflow_id, orders, workflow_id=workflow_id)
            else:
                handle = engine.start(many, workflow_id, int(which), workflow_id=workflow_id)
            print(json.dumps(handle.result(timeout=60)))
            return 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            handles = engine.recover()
            for h in handles:
                if h.workflow_id == workflow_id:
                    print(json.dumps(h.result(timeout=60)))
                    return 0
            time.sleep(0.1)
        print("nothing to recover", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
