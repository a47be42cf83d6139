"""durable.start_child and per-call timeouts, both drivers.

A child started from workflow code runs while its parent goes on; waiting for it parks the
parent (SUSPENDED: no worker slot, no thread) until the child's end wakes it, and the
outcome is journaled in the parent: after a sleep the parent's body runs again from the
top and gets the same value (or failure) without waiting or starting the child again.
`timeout=` on a start and `durable.workflow_timeout()` give one workflow a timeout of its
own; a child's never outlasts its parent's deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

import durable
from durable import errors

RUNS: list[str] = []
QUEUES: list[Any] = [None]


def build(asynchronous: bool) -> tuple[durable.Registry, Any, Any]:
    reg = durable.Registry()
    if asynchronous:

        @durable.workflow(registry=reg, name="kids.child")
        async def child(x: int) -> int:
            go = await durable.recv_async("go", timeout=60)
            if go == "fail":
                raise ValueError("the child failed")
            return x * 10

        @durable.workflow(registry=reg, name="kids.parent")
        async def parent(x: int) -> list[Any]:
            handle = await durable.start_child_async(child, x, workflow_id="kid")
            RUNS.append("parent body")
            try:
                got: Any = await handle
            except errors.WorkflowFailedError as failed:
                got = failed.error_message
            await durable.sleep_async(1.5)  # suspends: the body runs again from the top
            return [got, await handle.result_async()] if got != "the child failed" else [got]

        return reg, parent, child

    @durable.workflow(registry=reg, name="kids.child")
    def child(x: int) -> int:
        go = durable.recv("go", timeout=60)
        if go == "fail":
            raise ValueError("the child failed")
        return x * 10

    @durable.workflow(registry=reg, name="kids.parent")
    def parent(x: int) -> list[Any]:
        handle = durable.start_child(child, x, workflow_id="kid")
        RUNS.append("parent body")
        try:
            got: Any = handle.result()
        except errors.WorkflowFailedError as failed:
            got = failed.error_message
        durable.sleep(1.5)
        return [got, handle.result()] if got != "the child failed" else [got]

    return reg, parent, child


def status(url: str, workflow_id: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = %s", [workflow_id]
        ).fetchone()
    assert row is not None
    return str(row[0])


def wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("outcome", ["ok", "fail"])
def test_a_childs_result_parks_the_parent_and_replays_as_journaled(
    database_url: str, asynchronous: bool, outcome: str
) -> None:
    RUNS.clear()
    reg, parent, _ = build(asynchronous)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.submit(parent, 4, workflow_id="parent")
        # The parent waits for its child without holding anything: it is parked.
        wait_until(lambda: status(database_url, "parent") == "SUSPENDED", "the parent to park")
        assert status(database_url, "kid") == "SUSPENDED"  # the child waits for "go"
        engine.send("kid", outcome, topic="go")
        got = handle.result(timeout=30)
        steps = [(s.step_name, s.kind) for s in engine.steps("parent")]
    if outcome == "ok":
        assert got == [40, 40]
        # The second result() of the same handle is a call of its own, journaled too.
        assert steps.count(("child-result:kids.child@kid", durable.StepKind.CHILD)) == 2
    else:
        assert got == ["the child failed"]  # raised on the first run and on the replay
        assert steps.count(("child-result:kids.child@kid", durable.StepKind.CHILD)) == 1
    with psycopg.connect(database_url) as conn:
        children = conn.execute("SELECT count(*) FROM durable.workflows WHERE parent_id = 'parent'")
        assert children.fetchone() == (1,)  # the replays started no second child
    assert RUNS.count("parent body") >= 2  # the body ran again after its sleep


def test_start_child_only_in_workflow_code(database_url: str) -> None:
    reg, _, child = build(False)
    with pytest.raises(errors.NoEngineError, match="must be called from a workflow"):
        durable.start_child(child, 1)

    async def outside() -> None:
        await durable.start_child_async(child, 1)

    with pytest.raises(errors.NoEngineError, match="must be awaited in a workflow"):
        asyncio.run(outside())

    with durable.Engine(database_url, registry=reg):
        handle = durable.ChildHandle("kid", "kids.child", None)
        with pytest.raises(errors.NoEngineError, match=r"ChildHandle\.result"):
            handle.result()


# -- timeouts ---------------------------------------------------------------------------------


def stored_timeout(url: str, workflow_id: str) -> float | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT timeout_seconds FROM durable.workflows WHERE workflow_id = %s", [workflow_id]
        ).fetchone()
    assert row is not None
    return None if row[0] is None else float(row[0])


def timeouts_app() -> tuple[durable.Registry, Any, Any]:
    reg = durable.Registry()
    QUEUES[0] = durable.Queue("limits", registry=reg)

    @durable.workflow(registry=reg, name="limits.wait", timeout=3600)
    def wait_forever() -> Any:
        return durable.recv("never", timeout=600)

    @durable.workflow(registry=reg, name="limits.parent")
    def parent() -> list[Any]:
        first = durable.start_child(wait_forever, workflow_id="c-own")
        with durable.workflow_timeout(7200):  # longer than the parent has left: cut
            second = durable.start_child(wait_forever, workflow_id="c-scoped")
        third = durable.start_child(wait_forever, workflow_id="c-call", timeout=0.5)
        try:
            durable.wait_first([first, second, third])
        except errors.WorkflowTimeoutError as timed_out:  # a child that wins failing raises
            return [timed_out.workflow_id, type(timed_out).__name__]
        return []

    return reg, wait_forever, parent


def test_a_start_with_timeout_times_out_by_its_own(database_url: str) -> None:
    reg, wait_forever, _ = timeouts_app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        started = engine.start(wait_forever, workflow_id="w-start", timeout=0.5)
        with durable.workflow_timeout(0.5):
            submitted = engine.submit(wait_forever, workflow_id="w-submit")
        queued = engine.enqueue(QUEUES[0], wait_forever, workflow_id="w-queue", timeout=120)
        plain = engine.submit(wait_forever, workflow_id="w-plain")
        for handle in (started, submitted):
            with pytest.raises(errors.WorkflowTimeoutError):
                handle.result(timeout=30)
        assert stored_timeout(database_url, "w-start") == 0.5
        assert stored_timeout(database_url, "w-queue") == 120
        assert stored_timeout(database_url, "w-plain") == 3600  # the decorator's
        engine.cancel(plain.workflow_id)
        engine.cancel(queued.workflow_id)
        with pytest.raises(errors.InvalidWaitError):
            engine.start(wait_forever, timeout=0)
        with pytest.raises(errors.InvalidWaitError), durable.workflow_timeout(-1):
            pass


def test_async_starts_take_a_timeout_too(database_url: str) -> None:
    reg, wait_forever, _ = timeouts_app()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as e:
            handle = await e.start_async(wait_forever, workflow_id="a-start", timeout=0.5)
            with pytest.raises(errors.WorkflowTimeoutError):
                await handle.result(timeout=30)
            await e.enqueue_async(QUEUES[0], wait_forever, workflow_id="a-queue", timeout=60)
            await asyncio.to_thread(e.cancel, "a-queue")

    asyncio.run(main())
    assert stored_timeout(database_url, "a-start") == 0.5
    assert stored_timeout(database_url, "a-queue") == 60


def test_a_childs_deadline_never_outlives_its_parents(database_url: str) -> None:
    reg, _, parent = timeouts_app()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(parent, workflow_id="p", timeout=60)
        # The child with a timeout of its own times out first and wins the wait.
        assert handle.result(timeout=30) == ["c-call", "WorkflowTimeoutError"]
        own = stored_timeout(database_url, "c-own")
        scoped = stored_timeout(database_url, "c-scoped")
        assert own is not None and own <= 60  # not its decorator's 3600
        assert scoped is not None and scoped <= 60  # not the block's 7200
        assert stored_timeout(database_url, "c-call") == 0.5
        for child in ("c-own", "c-scoped"):
            engine.cancel(child)


def test_an_async_gather_of_child_results_parks_once_and_gets_both(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="fan.child")
    async def child(x: int) -> int:
        await durable.recv_async("go", timeout=60)
        return x + 1

    @durable.workflow(registry=reg, name="fan.parent")
    async def parent() -> list[int]:
        first = await durable.start_child_async(child, 1, workflow_id="fan-1")
        second = await durable.start_child_async(child, 2, workflow_id="fan-2")
        return list(await asyncio.gather(first.result_async(), second.result_async()))

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as e:
            handle = await e.start_async(parent, workflow_id="fan")
            await asyncio.to_thread(
                wait_until, lambda: status(database_url, "fan") == "SUSPENDED", "a park"
            )
            await e.send_async("fan-2", "go", topic="go")
            await e.send_async("fan-1", "go", topic="go")
            assert await handle.result(timeout=30) == [2, 3]

    asyncio.run(main())


# -- a start from workflow code, failed and resumed ---------------------------------------------

# Each start from workflow code, run by a workflow that fails once after it and is resumed:
# the replay must adopt the child journaled by the first run, never start another.
SYNC_STARTS = [
    "engine.start",
    "engine.submit",
    "engine.enqueue",
    "queue.enqueue",
    "durable.start_child",
    "client.submit",
    "client.enqueue",
]
ASYNC_STARTS = [
    "engine.start_async",
    "engine.enqueue_async",
    "durable.start_child_async",
    "client.enqueue_async",
]
HELD: dict[str, Any] = {}  # the engine, client and queue the workflows below start with


def kid_runs(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT workflow_id FROM kid_runs ORDER BY at").fetchall()
    return [str(r[0]) for r in rows]


def rows_of(url: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT workflow_id, parent_id, parent_step_seq FROM durable.workflows"
            " WHERE name = %s ORDER BY created_at",
            [name],
        ).fetchall()


def resumed_app(url: str) -> tuple[durable.Registry, Any, Any, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE kid_runs (workflow_id text NOT NULL,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    reg = durable.Registry()
    queue = durable.Queue("resumed.kids", registry=reg)
    fails = [True]

    @durable.step(registry=reg, name="resumed.ran")
    def ran() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO kid_runs (workflow_id) VALUES (%s)", [durable.workflow_id()])

    @durable.workflow(registry=reg, name="resumed.kid")
    def kid(n: int) -> int:
        ran()
        return n

    def fail_once() -> None:
        if fails[0]:
            fails[0] = False
            raise ValueError("fails once, after the start")

    @durable.workflow(registry=reg, name="resumed.parent")
    def parent(how: str) -> str:
        engine, client = HELD["engine"], HELD["client"]
        started: Any
        if how == "engine.start":
            started = engine.start(kid, 1)
        elif how == "engine.submit":
            started = engine.submit(kid, 1)
        elif how == "engine.enqueue":
            started = engine.enqueue(queue, kid, 1)
        elif how == "queue.enqueue":
            started = queue.enqueue(kid, 1)
        elif how == "durable.start_child":
            started = durable.start_child(kid, 1)
        elif how == "client.submit":
            started = client.submit(kid, 1)
        else:
            started = client.enqueue(queue, kid, 1)
        fail_once()
        return str(started.workflow_id)

    @durable.workflow(registry=reg, name="resumed.parent_async")
    async def parent_async(how: str) -> str:
        engine, client = HELD["engine"], HELD["client"]
        started: Any
        if how == "engine.start_async":
            started = await engine.start_async(kid, 1)
        elif how == "engine.enqueue_async":
            started = await engine.enqueue_async(queue, kid, 1)
        elif how == "durable.start_child_async":
            started = await durable.start_child_async(kid, 1)
        else:
            started = await client.enqueue_async(queue, kid, 1)
        fail_once()
        return str(started.workflow_id)

    HELD["queue"] = queue
    return reg, parent, parent_async, kid


@pytest.mark.parametrize("how", SYNC_STARTS + ASYNC_STARTS)
def test_a_start_in_a_resumed_workflow_adopts_its_child(database_url: str, how: str) -> None:
    reg, parent, parent_async, _ = resumed_app(database_url)
    workflow = parent_async if how in ASYNC_STARTS else parent
    with (
        durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine,
        durable.Client(database_url) as client,
    ):
        HELD.update(engine=engine, client=client)
        first = engine.start(workflow, how, workflow_id="parent")
        with pytest.raises(errors.WorkflowFailedError, match="fails once"):
            first.result(timeout=30)
        child_id = engine.resume("parent").result(timeout=30)
        engine.retrieve(child_id).result(timeout=30)
        journal = [(s.step_seq, s.kind, s.child_workflow_id) for s in engine.steps("parent")]
    # One child, the parent's, at the start's position; it ran once.
    assert rows_of(database_url, "resumed.kid") == [(child_id, "parent", 0)]
    assert child_id == "parent:child:0"
    assert journal == [(0, durable.StepKind.CHILD, child_id)]
    assert kid_runs(database_url) == [child_id]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_dedup_refusal_replays_as_refused_after_the_key_is_freed(
    database_url: str, asynchronous: bool
) -> None:
    reg, _, _, kid = resumed_app(database_url)
    queue = HELD["queue"]
    fails = [True]

    @durable.workflow(registry=reg, name="dedup.parent")
    def parent() -> str:
        try:
            taken = f"enqueued {queue.enqueue(kid, 2, dedup_key='k').workflow_id}"
        except errors.QueueDedupError as refused:
            taken = f"refused: {refused.workflow_id} holds {refused.dedup_key}"
        if fails[0]:
            fails[0] = False
            raise ValueError("fails once, after the refusal")
        return taken

    @durable.workflow(registry=reg, name="dedup.parent_async")
    async def parent_async() -> str:
        try:
            handle = await HELD["engine"].enqueue_async(queue, kid, 2, dedup_key="k")
            taken = f"enqueued {handle.workflow_id}"
        except errors.QueueDedupError as refused:
            taken = f"refused: {refused.workflow_id} holds {refused.dedup_key}"
        if fails[0]:
            fails[0] = False
            raise ValueError("fails once, after the refusal")
        return taken

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        HELD["engine"] = engine
        # The key's holder waits an hour before it may start: the key stays taken.
        holder = engine.enqueue(queue, kid, 1, workflow_id="holder", dedup_key="k", delay=3600)
        first = engine.start(parent_async if asynchronous else parent, workflow_id="parent")
        with pytest.raises(errors.WorkflowFailedError, match="fails once"):
            first.result(timeout=30)
        engine.cancel(holder.workflow_id)  # finished: the key is free again
        assert engine.resume("parent").result(timeout=30) == "refused: holder holds k"
        journal = [(s.step_seq, s.child_workflow_id) for s in engine.steps("parent")]
    # The replay took the same branch and enqueued nothing: no child ever ran.
    assert rows_of(database_url, "resumed.kid") == [("holder", None, None)]
    assert kid_runs(database_url) == []
    assert journal == [(0, None)]  # the refusal, journaled at the enqueue's position


def test_a_submit_from_async_workflow_code_is_refused(database_url: str) -> None:
    # It could not be journaled without blocking the loop: the awaited starts can.
    reg, _, _, kid = resumed_app(database_url)

    @durable.workflow(registry=reg, name="submits.async")
    async def submits() -> str:
        try:
            HELD["engine"].submit(kid, 1)
        except errors.BlockingCallError as refused:
            return str(refused)
        return "submitted"

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        HELD["engine"] = engine
        assert "start_async" in engine.start(submits).result(timeout=30)
    assert rows_of(database_url, "resumed.kid") == []
