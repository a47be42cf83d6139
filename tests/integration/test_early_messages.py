"""Messages sent before their workflow exists (send(..., before_start=True)) and
start_or_send (signal-with-start), in one process on the real database: the default still
refuses an unknown id; a kept message reaches the run started later, once, before the
messages sent after it; one kept while the run already looked is moved by its sender and
wakes the run; retention deletes those no workflow took; start_or_send creates and
delivers in one transaction, or just delivers. Real processes (a SIGKILLed sender or
receiver, two callers at once): tests/acceptance/test_early_messages_crash.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import durable
from durable import errors
from tests.conftest import ON_CITUS


def build() -> tuple[durable.Registry, Any, Any, Any]:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="early.inbox")
    def inbox(n: int) -> list[Any]:
        return [durable.recv("orders", timeout=30) for _ in range(n)]

    @durable.workflow(registry=reg, name="early.first")
    def first(n: int) -> list[Any]:
        got = []
        for _ in range(n):
            _, value = durable.wait_first([durable.on_message("orders"), durable.on_timer(30)])
            got.append(value)
        return got

    @durable.workflow(registry=reg, name="early.other")
    def other() -> None:
        return None

    return reg, inbox, first, other


def wait_until(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def kept(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, payload FROM durable.early_messages ORDER BY created_at"
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_send_to_an_unknown_id_still_raises_by_default(database_url: str) -> None:
    with durable.Client(database_url) as client:
        with pytest.raises(errors.WorkflowNotFoundError):
            client.send("typo-id", "hello")
    assert kept(database_url) == []


def test_a_message_sent_before_the_start_reaches_the_run_first_and_once(
    database_url: str,
) -> None:
    reg, inbox, _, _ = build()
    with durable.Engine(database_url, registry=reg, max_workers=2) as engine:
        engine.send("order-1", "early-1", topic="orders", before_start=True)
        engine.send("order-1", "early-2", topic="orders", before_start=True, idempotency_key="k")
        engine.send("order-1", "dup", topic="orders", before_start=True, idempotency_key="k")
        engine.send("order-1", "other topic", topic="audit", before_start=True)
        assert [p for _, p in kept(database_url)] == ['"early-1"', '"early-2"', '"other topic"']
        handle = engine.start(inbox, 3, workflow_id="order-1")
        wait_until(lambda: handle.status() == "SUSPENDED")
        engine.send("order-1", "later", topic="orders")  # the workflow exists: plain send
        assert handle.result(timeout=30) == ["early-1", "early-2", "later"]
        # A second workflow's run does not see the first's: each id keeps its own.
        assert engine.start(inbox, 0, workflow_id="order-2").result(timeout=30) == []
    assert kept(database_url) == []  # all moved to order-1, the other topic too
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT topic, payload, consumed_seq FROM durable.messages"
            " WHERE workflow_id = 'order-1' ORDER BY created_at"
        ).fetchall()
    assert [(t, p) for t, p, _ in rows] == [
        ("orders", '"early-1"'),
        ("orders", '"early-2"'),
        ("audit", '"other topic"'),
        ("orders", '"later"'),
    ]
    assert [seq is not None for _, _, seq in rows] == [True, True, False, True]


def test_wait_first_takes_a_message_kept_before_the_start(database_url: str) -> None:
    reg, _, first, _ = build()
    with durable.Engine(database_url, registry=reg, max_workers=2) as engine:
        engine.send("w-first", "early", topic="orders", before_start=True)
        assert engine.start(first, 1, workflow_id="w-first").result(timeout=30) == ["early"]


def test_an_async_run_takes_a_message_kept_before_the_start(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="early.ainbox")
    async def ainbox(n: int) -> list[Any]:
        return [await durable.recv_async("orders", timeout=30) for _ in range(n)]

    async def main() -> list[Any]:
        async with durable.Engine(database_url, registry=reg) as engine:
            await engine.send_async("w-async", "early", topic="orders", before_start=True)
            handle = await engine.start_async(ainbox, 1, workflow_id="w-async")
            return await handle.result()  # type: ignore[no-any-return]

    assert asyncio.run(main()) == ["early"]


def test_a_message_kept_after_the_run_looked_is_moved_by_its_sender(database_url: str) -> None:
    """The race the sender's second look closes: the workflow exists and its run already
    moved what was kept (nothing), and a message is kept after that (the sender's first
    statement did not see the workflow). The sender's look finds the workflow, moves the
    message and wakes the run."""
    reg, inbox, _, _ = build()
    with durable.Engine(database_url, registry=reg, max_workers=2) as engine:
        handle = engine.start(inbox, 1, workflow_id="late")
        wait_until(lambda: handle.status() == "SUSPENDED")
        # As a sender whose first statement ran before the workflow's row committed:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO durable.early_messages (workflow_id, message_id, topic, payload)"
                " VALUES ('late', 'm', 'orders', '\"raced\"')"
            )
        engine.client._adopt_early("late")  # the sender's look after its commit
        assert handle.result(timeout=30) == ["raced"]
    assert kept(database_url) == []


@pytest.mark.skipif(
    ON_CITUS,
    reason="retention reads every shard, where the clock is the worker's, not a FakeClock's",
)
def test_retention_deletes_messages_no_workflow_took(database_url: str) -> None:
    clock = durable.FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    with durable.Client(database_url, clock=clock) as client:
        client.send("never-1", "old", before_start=True)
        clock.advance(dt.timedelta(days=6))
        client.send("never-2", "recent", before_start=True)
        clock.advance(dt.timedelta(days=2))
        policy = durable.RetentionPolicy(early_messages_after=dt.timedelta(days=7))
        assert client.prune(policy, dry_run=True).early_messages == 1
        assert client.prune(policy).early_messages == 1
        assert kept(database_url) == [("never-2", '"recent"')]
        with pytest.raises(errors.ConfigurationError):
            durable.RetentionPolicy(early_messages_after=dt.timedelta(days=-1))


def test_start_or_send_creates_the_workflow_with_its_message(database_url: str) -> None:
    reg, inbox, _, other = build()
    with durable.Engine(database_url, registry=reg, max_workers=2) as engine:
        handle = engine.start_or_send(inbox, 2, workflow_id="sws", message="a", topic="orders")
        wait_until(lambda: handle.status() == "SUSPENDED")
        again = engine.start_or_send(inbox, 2, workflow_id="sws", message="b", topic="orders")
        assert again.workflow_id == "sws"
        assert handle.result(timeout=30) == ["a", "b"]
        # Another function under the id: refused, and nothing is sent.
        with pytest.raises(errors.WorkflowConflictError):
            engine.start_or_send(other, workflow_id="sws", message="c", topic="orders")
        with pytest.raises(errors.SerializationError):  # before anything is written
            engine.start_or_send(inbox, 1, workflow_id="sws2", message=object())
    with psycopg.connect(database_url) as conn:
        count = conn.execute("SELECT count(*) FROM durable.messages").fetchone()
        runs = conn.execute("SELECT count(*) FROM durable.workflows").fetchone()
    assert count == (2,) and runs == (1,)


def test_start_or_send_of_a_client_records_it_for_a_worker(database_url: str) -> None:
    reg, inbox, _, _ = build()
    with durable.Client(database_url) as client:
        client.start_or_send(
            inbox, 2, workflow_id="cl", message="a", topic="orders", idempotency_key="ka"
        )
        client.start_or_send(
            inbox, 2, workflow_id="cl", message="a", topic="orders", idempotency_key="ka"
        )  # the same key: delivered once
        client.start_or_send(inbox, 2, workflow_id="cl", message="b", topic="orders")
        assert client.get_workflow("cl").status == "PENDING"
    with durable.Engine(database_url, registry=reg, worker=True) as engine:
        assert engine.retrieve("cl").result(timeout=30) == ["a", "b"]


def test_start_or_send_is_refused_in_workflow_code(database_url: str) -> None:
    reg, inbox, _, _ = build()

    with durable.Engine(database_url, registry=reg) as engine:

        @durable.workflow(registry=reg, name="early.parent")
        def parent() -> None:
            engine.start_or_send(inbox, 1, workflow_id="kid", message="x")

        with pytest.raises(errors.WorkflowFailedError, match="start_or_send"):
            engine.start(parent).result(timeout=30)


def test_concurrent_start_or_send_in_threads_makes_one_workflow(database_url: str) -> None:
    reg, inbox, _, _ = build()
    with durable.Client(database_url) as client:
        barrier = threading.Barrier(4)

        def call(i: int) -> None:
            barrier.wait()
            client.start_or_send(inbox, 4, workflow_id="many", message=i, topic="orders")

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with durable.Engine(database_url, registry=reg, worker=True) as engine:
        assert sorted(engine.retrieve("many").result(timeout=30)) == [0, 1, 2, 3]


def test_an_operators_message_kept_before_the_start_is_audited(database_url: str) -> None:
    with durable.Client(database_url, actor="ana@ops") as client:
        client.send("unborn", "hi", topic="orders", idempotency_key="k-1", before_start=True)
        rows = client.audit_log("unborn")
    assert [(r["action"], r["subject"], r["detail"], r["actor"]) for r in rows] == [
        ("send", "orders", "k-1", "ana@ops")
    ]


def test_the_awaited_start_or_send_of_an_engine_and_of_a_client(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="early.ainbox2")
    async def ainbox(n: int) -> list[Any]:
        return [await durable.recv_async("orders", timeout=30) for _ in range(n)]

    async def main() -> tuple[list[Any], list[Any]]:
        async with durable.Engine(database_url, registry=reg, worker=True) as engine:
            here = await engine.start_or_send_async(
                ainbox, 2, workflow_id="aw-1", message="a", topic="orders"
            )
            await engine.start_or_send_async(
                ainbox, 2, workflow_id="aw-1", message="b", topic="orders"
            )
            with durable.Client(database_url) as client:
                there = await client.start_or_send_async(
                    ainbox, 1, workflow_id="aw-2", message="c", topic="orders"
                )
                return await here.result(), await there.result(timeout=30)

    assert asyncio.run(main()) == (["a", "b"], ["c"])
