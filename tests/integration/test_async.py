"""async def workflows and steps, in one process against a real database: the async
driver journals and replays like the sync one, parallel steps take their positions in
call order, step timeouts cancel and retry, a cancel interrupts an awaiting step, and
mixing sync and async says what to do instead."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
from typing import Any

import pytest
import sqlalchemy

import durable
from durable import errors
from durable.errors import WorkflowNotFoundError


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_async_workflow_journals_and_replays_parallel_steps_in_call_order(
    database_url: str,
) -> None:
    reg = durable.Registry()
    calls: list[int] = []
    fail = {"tail": True}

    @durable.step(registry=reg)
    async def ask(i: int) -> int:
        await asyncio.sleep(random.random() * 0.05)  # finish in a random order
        calls.append(i)
        return i * 10

    @durable.step(registry=reg)
    async def tail() -> str:
        if fail["tail"]:
            raise RuntimeError("flaky")
        return "done"

    @durable.workflow(registry=reg)
    async def fan(n: int) -> list[Any]:
        answers = await asyncio.gather(*(ask(i) for i in range(n)))
        return [*answers, await tail()]

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            handle = await engine.start_async(fan, 10, workflow_id="fan")
            with pytest.raises(errors.WorkflowFailedError, match="flaky"):
                await handle.result(timeout=20)
            steps = engine.steps("fan")
            # Position n belongs to the n-th call, whatever order they finished in.
            assert [(s.step_seq, s.output) for s in steps[:10]] == [
                (i, str(i * 10)) for i in range(10)
            ]
            assert sorted(calls) == list(range(10))
            fail["tail"] = False
            calls.clear()
            again = engine.resume("fan")
            assert await durable.AsyncWorkflowHandle(engine.client, again.workflow_id).result(
                20
            ) == [
                *(i * 10 for i in range(10)),
                "done",
            ]
            assert calls == []  # the ten journaled steps replayed, none ran again

    run(main())


def test_sync_steps_through_to_thread_and_errors_that_say_what_to_do(database_url: str) -> None:
    reg = durable.Registry()
    threads: list[str] = []

    @durable.step(registry=reg)
    def blocking(x: int) -> int:
        threads.append(threading.current_thread().name)
        time.sleep(0.01)
        return x + 1

    @durable.workflow(registry=reg)
    async def uses_sync(x: int) -> list[int]:
        a, b = await asyncio.gather(durable.to_thread(blocking, x), durable.to_thread(blocking, 10))
        return [a, b]

    @durable.workflow(registry=reg)
    async def calls_sync_directly() -> int:
        return blocking(1)  # type: ignore[no-any-return]

    @durable.workflow(registry=reg)
    async def sync_sleep() -> None:
        durable.sleep(0.1)

    @durable.step(registry=reg)
    async def nap() -> int:
        return 1

    @durable.workflow(registry=reg)
    def sync_calls_async() -> Any:
        return nap()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(uses_sync, 1, workflow_id="uses-sync")
            assert await h.result(timeout=10) == [2, 11]
            assert all(name != "MainThread" for name in threads)
            assert [s.output for s in engine.steps("uses-sync")] == ["2", "11"]
            h = await engine.start_async(calls_sync_directly, workflow_id="direct")
            with pytest.raises(errors.WorkflowFailedError, match=r"durable\.to_thread"):
                await h.result(timeout=10)
            h = await engine.start_async(sync_sleep, workflow_id="sync-sleep")
            with pytest.raises(errors.WorkflowFailedError, match=r"await durable\.sleep_async"):
                await h.result(timeout=10)
            h = await engine.start_async(sync_calls_async, workflow_id="sync-async")
            with pytest.raises(errors.WorkflowFailedError, match="AsyncInSyncError"):
                await h.result(timeout=10)

    run(main())


def test_a_hanging_attempt_is_cancelled_retried_and_recorded(database_url: str) -> None:
    reg = durable.Registry()
    attempts: list[str] = []

    @durable.step(retries=3, initial_delay=0, jitter=0, timeout=0.3, registry=reg)
    async def call_model() -> str:
        attempts.append("start")
        if len(attempts) <= 2:
            await asyncio.sleep(60)  # hangs
            attempts.append("never")
        return "answer"

    @durable.step(timeout=0.2, registry=reg)
    async def always_hangs() -> None:
        await asyncio.sleep(60)

    @durable.workflow(registry=reg)
    async def agent() -> str:
        return await call_model()

    @durable.workflow(registry=reg)
    async def stuck() -> None:
        await always_hangs()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            began = time.monotonic()
            h = await engine.start_async(agent, workflow_id="agent")
            assert await h.result(timeout=10) == "answer"
            assert time.monotonic() - began < 5
            assert attempts == ["start", "start", "start"]  # two cancelled, one finished
            (record,) = engine.steps("agent")
            assert record.attempts == 3 and record.output == '"answer"'
            h = await engine.start_async(stuck, workflow_id="stuck")
            with pytest.raises(errors.WorkflowFailedError, match="StepTimeoutError"):
                await h.result(timeout=10)
            (record,) = engine.steps("stuck")
            assert record.attempts == 1 and "timeout of 0.2 s" in (record.error or "")

    run(main())


def test_cancel_interrupts_an_awaiting_step_and_compensates(database_url: str) -> None:
    reg = durable.Registry()
    ledger: list[str] = []

    @durable.effect(idempotent=True, registry=reg)
    async def book(item: str, *, idempotency_key: str) -> str:
        ledger.append(f"+{item}")
        return item

    @book.compensation  # type: ignore[attr-defined]
    @durable.effect(idempotent=True, registry=reg)
    async def unbook(item: str, *, idempotency_key: str) -> None:
        ledger.append(f"-{item}")

    @durable.step(registry=reg)
    async def think() -> None:
        ledger.append("thinking")
        await asyncio.sleep(60)
        ledger.append("thought")

    @durable.workflow(registry=reg)
    async def trip() -> None:
        await book("hotel")
        await think()
        ledger.append("after")

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(trip, workflow_id="trip")
            while "thinking" not in ledger:
                await asyncio.sleep(0.01)
            began = time.monotonic()
            await asyncio.to_thread(engine.cancel, "trip", reason="changed plans")
            with pytest.raises(errors.WorkflowCancelledError):
                await h.result(timeout=10)
            assert time.monotonic() - began < 3  # not the 60 s of the step
            assert ledger == ["+hotel", "thinking", "-hotel"]
            assert [s.step_name.rsplit(".", 1)[-1] for s in engine.steps("trip")] == [
                "book",
                "unbook",
            ]

    run(main())


def test_async_transaction_commits_with_its_record(database_url: str) -> None:
    reg = durable.Registry()
    fail = {"after": True}

    @durable.transaction(registry=reg)
    async def save(conn: Any, answer: str) -> int:
        await conn.execute(sqlalchemy.text("CREATE TABLE IF NOT EXISTS answers (a text)"))
        await conn.execute(sqlalchemy.text("INSERT INTO answers VALUES (:a)"), {"a": answer})
        result = await conn.execute(sqlalchemy.text("SELECT count(*) FROM answers"))
        return int(result.scalar_one())

    @durable.transaction(registry=reg)
    async def broken(conn: Any) -> None:
        await conn.execute(sqlalchemy.text("INSERT INTO answers VALUES ('rolled back')"))
        raise ValueError("no")

    @durable.step(registry=reg)
    async def after() -> None:
        if fail["after"]:
            raise RuntimeError("crash after the transaction")

    @durable.workflow(registry=reg)
    async def research() -> int:
        n = await save("tides")
        try:
            await broken()
        except ValueError:
            pass
        await after()
        return n

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(research, workflow_id="tx")
            with pytest.raises(errors.WorkflowFailedError):
                await h.result(timeout=10)
            fail["after"] = False
            engine.resume("tx")
            assert await durable.AsyncWorkflowHandle(engine.client, "tx").result(10) == 1
            async with engine.app_connection_async() as conn:
                rows = (await conn.execute(sqlalchemy.text("SELECT a FROM answers"))).all()
            assert [r[0] for r in rows] == ["tides"]  # once, and the failed one rolled back

    run(main())


def test_async_stale_owner_transaction_rolls_back_its_app_write(database_url: str) -> None:
    """The record goes with the COMMIT in one pipeline: when this run lost its workflow
    meanwhile, the record raises and the COMMIT behind it keeps nothing."""
    import psycopg

    reg = durable.Registry()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (what text)")

    @durable.transaction(registry=reg, name="write_ledger")
    async def write_ledger(conn: Any, what: str) -> str:
        await conn.execute(sqlalchemy.text("INSERT INTO ledger VALUES (:w)"), {"w": what})
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other:
            await other.execute(
                "UPDATE durable.workflows SET epoch = epoch + 1, owner = 'other-worker'"
                " WHERE status = 'RUNNING'"
            )
        return what

    @durable.workflow(registry=reg, name="zombie_tx")
    async def zombie_tx() -> str:
        return await write_ledger("refund o1")

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            with pytest.raises(errors.StaleOwnerError):
                await zombie_tx()
            (info,) = engine.list_workflows()
            assert engine.steps(info.workflow_id) == []
            assert info.status == "RUNNING" and info.owner == "other-worker"

    run(main())
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (0,)


def test_parallel_children_messages_events_state_and_charges(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def priced(i: int) -> int:
        await asyncio.sleep(random.random() * 0.02)
        durable.charge(dollars=0.25, tokens=10 * (i + 1))
        return i

    @durable.workflow(registry=reg)
    async def child(i: int) -> int:
        return await priced(i) * 2

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=100))
    async def parent(n: int) -> dict[str, Any]:
        doubled = await asyncio.gather(*(child(i) for i in range(n)))
        await durable.state.set_async({"phase": "waiting"})
        await durable.append_turn_async("user", "go?")
        await durable.set_event_async("asked", True)
        reply = await durable.recv_async("reply", timeout=30)
        await durable.state.update_async(phase="done")
        return {"doubled": list(doubled), "reply": reply, "state": durable.state.get()}

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(parent, 4, workflow_id="p")
            assert await engine.get_event_async("p", "asked", timeout=10) is True
            await engine.send_async("p", "yes", topic="reply")
            assert await h.result(timeout=20) == {
                "doubled": [0, 2, 4, 6],
                "reply": "yes",
                "state": {"phase": "done"},
            }
            children = [s.child_workflow_id for s in engine.steps("p")[:4]]
            assert children == [f"p:child:{i}" for i in range(4)]
            for i, child_id in enumerate(children):
                assert engine.steps(child_id)[0].output == str(i)
            budget = engine.budget("p")
            assert budget is not None
            spent = budget["spent"]  # four parallel steps, each charged apart
            assert (spent["dollars"], spent["tokens"], spent["steps"]) == (1.0, 100, 4)
            assert sorted(c["tokens"] for c in budget["charges"]) == [10, 20, 30, 40]
            assert engine.client.conversation("p") == [{"role": "user", "content": "go?"}]

    run(main())


def test_a_long_sleep_suspends_and_the_engine_resumes_it_on_the_same_loop(
    database_url: str,
) -> None:
    reg = durable.Registry()
    loops: list[int] = []

    @durable.step(registry=reg)
    async def where() -> None:
        loops.append(id(asyncio.get_running_loop()))

    @durable.workflow(registry=reg)
    async def napper() -> str:
        await where()
        await durable.sleep_async(1.5)  # longer than an in-place sleep: suspends
        await where()
        return "rested"

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(napper, workflow_id="nap")
            while await h.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.02)
            assert await h.result(timeout=20) == "rested"
            assert loops == [id(asyncio.get_running_loop())] * 2

    run(main())


def test_sync_code_can_call_an_async_workflow_and_await_is_refused_in_sync(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def inc(x: int) -> int:
        return x + 1

    @durable.workflow(registry=reg)
    async def bump(x: int) -> int:
        return await inc(x)

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(bump, 41, workflow_id="from-sync")  # on the engine's own loop
        assert handle.result(timeout=10) == 42
        assert [s.output for s in engine.steps("from-sync")] == ["42"]


def test_an_async_workflow_starts_and_enqueues_children_once(database_url: str) -> None:
    reg = durable.Registry()
    queue = durable.Queue("async-q", registry=reg)
    ran: list[str] = []
    fail = {"end": True}

    @durable.workflow(registry=reg)
    async def job(tag: str) -> str:
        ran.append(tag)
        return tag.upper()

    @durable.step(registry=reg)
    async def end() -> None:
        if fail["end"]:
            raise RuntimeError("once")

    @durable.workflow(registry=reg)
    async def boss() -> list[str]:
        started = await engine_ref[0].start_async(job, "started")
        queued = await engine_ref[0].enqueue_async(queue, job, "queued")
        results = [await started.result(20), await queued.result(20)]
        await end()
        return results

    @durable.workflow(registry=reg)
    async def sync_enqueue_in_async() -> None:
        engine_ref[0].enqueue(queue, job, "never")

    engine_ref: list[durable.Engine] = []

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, worker=True) as engine:
            engine_ref.append(engine)
            h = await engine.start_async(boss, workflow_id="boss")
            with pytest.raises(errors.WorkflowFailedError, match="once"):
                await h.result(timeout=30)
            fail["end"] = False
            engine.resume("boss")
            assert await durable.AsyncWorkflowHandle(engine.client, "boss").result(30) == [
                "STARTED",
                "QUEUED",
            ]
            assert sorted(ran) == ["queued", "started"]  # the replay started nothing again
            assert [s.child_workflow_id for s in engine.steps("boss")[:2]] == [
                "boss:child:0",
                "boss:child:1",
            ]
            h = await engine.start_async(sync_enqueue_in_async, workflow_id="bad")
            with pytest.raises(errors.WorkflowFailedError, match="enqueue_async"):
                await h.result(timeout=10)

    run(main())


def test_the_workflow_timeout_interrupts_an_awaiting_step(database_url: str) -> None:
    reg = durable.Registry()
    seen: list[str] = []

    @durable.step(registry=reg)
    async def slow() -> None:
        seen.append("start")
        await asyncio.sleep(60)
        seen.append("end")

    @durable.workflow(timeout=1, registry=reg)
    async def bounded() -> None:
        await slow()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            began = time.monotonic()
            h = await engine.start_async(bounded, workflow_id="bounded")
            with pytest.raises(errors.WorkflowTimeoutError):
                await h.result(timeout=20)
            assert time.monotonic() - began < 5
            assert seen == ["start"]
            assert await h.status() == durable.WorkflowStatus.CANCELLED

    run(main())


def test_async_workflows_from_a_queue_and_a_schedule(database_url: str) -> None:
    import datetime as dt

    reg = durable.Registry()
    queue = durable.Queue("async-jobs", concurrency=2, registry=reg)

    @durable.step(registry=reg)
    async def double(x: int) -> int:
        await asyncio.sleep(0.01)
        return 2 * x

    @durable.workflow(registry=reg)
    async def job(x: int) -> int:
        return await double(x)

    @durable.workflow(registry=reg, name="async-report")
    async def report(tick: dt.datetime) -> str:
        return tick.isoformat()

    clock = durable.FakeClock(dt.datetime(2026, 1, 5, 7, 58, 30, tzinfo=dt.UTC))
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, clock=clock
    ) as engine:
        handles = [engine.enqueue(queue, job, i) for i in range(6)]
        assert [h.result(timeout=20) for h in handles] == [0, 2, 4, 6, 8, 10]
        engine.schedule("every-minute", report, "* * * * *")
        engine.fire_schedules()  # a new schedule starts at its next tick
        clock.advance(60)
        engine.fire_schedules()
        tick = "2026-01-05T07:59:00+00:00"
        # The engine's own worker fires schedules too: when its round holds the schedule
        # (having read the clock before the advance), this call skips it and the worker's
        # next round fires the tick.
        deadline = time.monotonic() + 20
        while True:
            try:
                handle = engine.retrieve(f"schedule:every-minute:{tick}")
                break
            except WorkflowNotFoundError:
                assert time.monotonic() < deadline, "the tick was never fired"
                time.sleep(0.05)
        assert handle.result(timeout=20) == tick


@pytest.mark.parametrize(
    ("kind", "stored"),
    [("sync", "new"), ("sync", "pending"), ("async", "new"), ("async", "pending")],
)
def test_a_failure_the_caller_awaited_is_not_reported_again_as_never_retrieved(
    database_url: str, kind: str, stored: str
) -> None:
    """A workflow started with start_async fails; its caller awaits the result and catches
    the error. That error was retrieved: the event loop must not report a future whose
    exception 'was never retrieved', whether the workflow is sync (run on the engine's
    threads) or async, new or already recorded (pending) when it was started."""
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="fails_sync")
    def fails_sync() -> None:
        raise ValueError("sync boom")

    @durable.workflow(registry=reg, name="fails_async")
    async def fails_async() -> None:
        raise ValueError("async boom")

    flow: Any = fails_sync if kind == "sync" else fails_async
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        async with durable.Engine(database_url, registry=reg) as engine:
            if stored == "pending":
                await asyncio.to_thread(engine.submit, flow, workflow_id="f")
            handle = await engine.start_async(flow, workflow_id="f")
            with pytest.raises(errors.WorkflowFailedError, match="boom"):
                await handle.result(timeout=20)
            del handle
            gc.collect()  # a future dropped with its exception unread is reported here

    run(main())
    gc.collect()
    assert [ctx["message"] for ctx in reported] == []
