"""Hostile tests of async def workflows: the corners where a run is cut short, runs in
parallel branches, outlives its event loop or its engine."""

from __future__ import annotations

import asyncio
import gc
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

import durable
from durable import errors


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def backends(url: str) -> int:
    """Connections to this test's database other than this one."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


# -- cancellation ------------------------------------------------------------------------------


def test_cancel_during_a_retry_backoff_still_interrupts_the_next_attempt(
    database_url: str,
) -> None:
    """A cancel that lands while a step waits out its retry backoff must stop the
    workflow promptly, not after the next (hanging) attempt has run to its end."""
    reg = durable.Registry()
    attempts: list[float] = []

    @durable.step(retries=3, initial_delay=0.6, jitter=0, registry=reg)
    async def flaky() -> str:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails fast")
        await asyncio.sleep(8)  # the second attempt hangs
        return "late"

    @durable.workflow(registry=reg)
    async def wf() -> str:
        return await flaky()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, grace_seconds=1) as engine:
            h = await engine.start_async(wf, workflow_id="backoff")
            while not attempts:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # inside the 0.6 s backoff
            began = time.monotonic()
            await asyncio.to_thread(engine.cancel, "backoff", reason="stop")
            with pytest.raises((errors.WorkflowCancelledError, errors.ResultTimeoutError)):
                await h.result(timeout=4)
            took = time.monotonic() - began
            assert took < 3, f"cancel took {took:.1f} s: the second attempt was not interrupted"

    run(main())


# -- parallel branches -------------------------------------------------------------------------


def test_a_failing_gather_branch_leaves_no_step_running_after_the_workflow_ended(
    database_url: str,
) -> None:
    """gather() raises the first error and leaves the other branches running. The workflow
    then ends (ERROR, or COMPENSATED after its undo ran): a branch still running must not
    go on moving the world and journaling after that end, where no compensation will ever
    see it."""
    reg = durable.Registry()
    ledger: list[str] = []

    @durable.effect(idempotent=True, registry=reg)
    async def charge_card(amount: int, *, idempotency_key: str) -> int:
        await asyncio.sleep(0.5)
        ledger.append(f"+{amount}")
        return amount

    @charge_card.compensation  # type: ignore[attr-defined]
    @durable.effect(idempotent=True, registry=reg)
    async def refund(amount: int, *, idempotency_key: str) -> None:
        ledger.append(f"-{amount}")

    @durable.step(registry=reg)
    async def check() -> None:
        await asyncio.sleep(0.05)
        raise ValueError("fraud suspected")

    @durable.workflow(registry=reg)
    async def pay() -> None:
        await asyncio.gather(charge_card(10), check())

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(pay, workflow_id="pay")
            with pytest.raises(errors.WorkflowFailedError, match="fraud"):
                await h.result(timeout=10)
            ended = await h.status()
            await asyncio.sleep(1.0)  # the charge branch had 0.45 s left
            steps = [s.step_name.rsplit(".", 1)[-1] for s in engine.steps("pay")]
            # Either the charge never lands, or it is undone: money must not stay moved
            # on a workflow that ended without it.
            assert ledger in ([], ["+10", "-10"]), (ended, ledger, steps)

    run(main())


# -- shutting down with runs in flight ---------------------------------------------------------


def test_leaving_a_sync_engine_waits_for_an_async_run_it_started(database_url: str) -> None:
    """`with Engine()` waits up to grace_seconds for running workflows: an async one
    started with engine.start (run on the engine's own loop) must be waited for too,
    not have its connections closed under it."""
    reg = durable.Registry()
    seen: list[str] = []

    @durable.step(registry=reg)
    async def slow() -> str:
        seen.append("start")
        await asyncio.sleep(0.8)
        seen.append("end")
        return "ok"

    @durable.workflow(registry=reg)
    async def wf() -> str:
        return await slow()

    with durable.Engine(database_url, registry=reg, grace_seconds=10) as engine:
        engine.start(wf, workflow_id="inflight")
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    del engine
    gc.collect()  # the run's task, if destroyed pending, is reported here, not later
    with durable.Client(database_url) as client:
        status = client.get_workflow("inflight").status
    assert seen == ["start", "end"] and status == durable.WorkflowStatus.SUCCESS, (seen, status)


def test_leaving_async_with_waits_for_a_run_resumed_after_a_sleep(database_url: str) -> None:
    """A run resumed after a suspension (submitted back to its home loop by the keeper)
    is in flight when the application leaves `async with engine`: it is waited for like
    one started there, not cut off when the loop's pool closes."""
    reg = durable.Registry()
    seen: list[str] = []

    @durable.step(registry=reg)
    async def slow() -> str:
        seen.append("start")
        await asyncio.sleep(0.8)
        seen.append("end")
        return "ok"

    @durable.workflow(registry=reg)
    async def wf() -> str:
        await durable.sleep_async(1.1)  # suspends
        return await slow()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, grace_seconds=10) as engine:
            await engine.start_async(wf, workflow_id="resumed")
            deadline = time.monotonic() + 6
            while not seen and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert seen == ["start"]

    run(main())
    with durable.Client(database_url) as client:
        status = client.get_workflow("resumed").status
    assert seen == ["start", "end"] and status == durable.WorkflowStatus.SUCCESS, (seen, status)


# -- event loops that end before the engine --------------------------------------------------


def test_asyncio_run_ending_gives_back_the_loops_connections(database_url: str) -> None:
    """An engine opened with `with` and used from successive asyncio.run() calls (a CLI,
    a test suite, a sync web app calling async helpers): each loop's pool is opened on
    first use; when that loop ends, its connections must not stay open for the life of
    the engine."""
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def one() -> int:
        return 1

    @durable.workflow(registry=reg)
    async def wf() -> int:
        return await one()

    with durable.Engine(database_url, registry=reg, max_workers=1) as engine:

        async def main(i: int) -> int:
            h = await engine.start_async(wf, workflow_id=f"loop-{i}")
            return int(await h.result(timeout=10))

        assert run(main(0)) == 1
        baseline = backends(database_url)
        for i in range(1, 6):
            assert run(main(i)) == 1
        gc.collect()
        # A pool closed with its loop ends its backends a moment later (under load, after
        # the next look): wait for them; a pool left open would keep them.
        deadline = time.monotonic() + 15
        while (grown := backends(database_url) - baseline) > 1:
            assert time.monotonic() < deadline, (
                f"{grown} more connections after 5 more asyncio.run() calls"
            )
            time.sleep(0.05)


def test_a_run_cut_off_by_asyncio_run_ending_is_finished_by_its_engine(database_url: str) -> None:
    """asyncio.run() returns while a workflow it started is mid-step: the task is
    cancelled with the loop and the workflow handed back; the engine (still open, not a
    worker) finishes it on its own loop."""
    reg = durable.Registry()
    seen: list[str] = []

    @durable.step(registry=reg)
    async def slow() -> str:
        seen.append("start")
        await asyncio.sleep(0.3)
        seen.append("end")
        return "ok"

    @durable.workflow(registry=reg)
    async def wf() -> str:
        return await slow()

    with durable.Engine(database_url, registry=reg) as engine:

        async def main() -> None:
            await engine.start_async(wf, workflow_id="orphan")
            while not seen:
                await asyncio.sleep(0.01)

        run(main())
        try:
            assert engine.client.handle("orphan").result(timeout=5) == "ok"
        except errors.ResultTimeoutError:
            status = engine.get_workflow("orphan").status
            pytest.fail(f"left {status.value}, never resumed by the engine that started it")


# -- what should work (and does): cancel trees, nesting, mixing, clocks, modes ----------------


def test_cancelling_a_parent_interrupts_its_inline_childs_step(database_url: str) -> None:
    reg = durable.Registry()
    seen: list[str] = []

    @durable.step(registry=reg)
    async def hang() -> None:
        seen.append("hang")
        await asyncio.sleep(30)

    @durable.workflow(registry=reg)
    async def kid() -> None:
        await hang()

    @durable.workflow(registry=reg)
    async def parent() -> None:
        await kid()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, grace_seconds=1) as engine:
            h = await engine.start_async(parent, workflow_id="tree")
            while not seen:
                await asyncio.sleep(0.01)
            began = time.monotonic()
            with durable.Client(database_url) as client:  # another client: the poll sees it
                await asyncio.to_thread(client.cancel, "tree")
            with pytest.raises(errors.WorkflowCancelledError):
                await h.result(timeout=6)
            assert time.monotonic() - began < 4
            kid_status = (await asyncio.to_thread(engine.get_workflow, "tree:child:0")).status
            assert kid_status == durable.WorkflowStatus.CANCELLED

    run(main())


def test_cancel_during_a_gather_interrupts_every_branch_and_undoes_once(
    database_url: str,
) -> None:
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
    async def think(i: int) -> None:
        ledger.append(f"think{i}")
        await asyncio.sleep(30)

    @durable.workflow(registry=reg)
    async def trip() -> None:
        await book("hotel")
        await asyncio.gather(think(1), think(2))

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, grace_seconds=1) as engine:
            h = await engine.start_async(trip, workflow_id="trip")
            while "think2" not in ledger:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(engine.cancel, "trip")
            with pytest.raises(errors.WorkflowCancelledError):
                await h.result(timeout=5)
            await asyncio.sleep(0.2)
            assert ledger == ["+hotel", "think1", "think2", "-hotel"]

    run(main())


def test_a_step_that_swallows_its_cancellation_still_lets_the_workflow_stop(
    database_url: str,
) -> None:
    reg = durable.Registry()
    seen: list[str] = []

    @durable.step(registry=reg)
    async def stubborn() -> str:
        seen.append("in")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("swallowed")
        return "kept going"

    @durable.step(registry=reg)
    async def after() -> None:
        seen.append("after")

    @durable.workflow(registry=reg)
    async def wf() -> None:
        await stubborn()
        await after()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, grace_seconds=1) as engine:
            h = await engine.start_async(wf, workflow_id="stubborn")
            while not seen:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(engine.cancel, "stubborn")
            with pytest.raises(errors.WorkflowCancelledError):
                await h.result(timeout=5)
            assert seen == ["in", "swallowed"]

    run(main())


def test_cancel_inside_an_async_transaction_rolls_it_back(database_url: str) -> None:
    import sqlalchemy

    reg = durable.Registry()
    seen: list[str] = []

    @durable.transaction(registry=reg)
    async def write(conn: Any) -> None:
        await conn.execute(sqlalchemy.text("CREATE TABLE IF NOT EXISTS t (a int)"))
        await conn.execute(sqlalchemy.text("INSERT INTO t VALUES (1)"))
        seen.append("written")
        await asyncio.sleep(30)

    @durable.workflow(registry=reg)
    async def wf() -> None:
        await write()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, grace_seconds=1) as engine:
            h = await engine.start_async(wf, workflow_id="tx")
            while not seen:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(engine.cancel, "tx")
            with pytest.raises(errors.WorkflowCancelledError):
                await h.result(timeout=5)
            assert engine.steps("tx") == []

    run(main())
    with psycopg.connect(database_url) as conn:
        exists = conn.execute("SELECT to_regclass('public.t')").fetchone()
    assert exists == (None,)  # the table and its row rolled back with the transaction


def test_sync_workflow_calls_async_children_nested_three_deep(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def leaf(x: int) -> int:
        await asyncio.sleep(0.01)
        return x + 1

    @durable.workflow(registry=reg)
    async def level3(x: int) -> int:
        return await leaf(x)

    @durable.workflow(registry=reg)
    async def level2(x: int) -> int:
        a, b = await asyncio.gather(level3(x), level3(x + 10))
        return a + b

    @durable.workflow(registry=reg)
    async def level1(x: int) -> int:
        return await level2(x) * 2

    @durable.workflow(registry=reg)
    def sync_root(x: int) -> int:
        child = engines[0].start(level1, x)  # a sync workflow starts an async child
        return int(child.result(timeout=10)) + 1

    engines: list[durable.Engine] = []
    with durable.Engine(database_url, registry=reg, max_workers=1) as engine:
        engines.append(engine)
        h = engine.start(sync_root, 1, workflow_id="root")
        assert h.result(timeout=10) == ((2 + 12) * 2) + 1
        assert engine.steps("root:child:0:child:0:child:1")[0].output == "12"


def test_an_async_workflow_awaits_a_sync_workflow_it_started(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg)
    def sync_job(x: int) -> int:
        time.sleep(0.05)
        return x * 3

    @durable.workflow(registry=reg)
    async def boss(n: int) -> list[int]:
        engine = engines[0]
        handles = [await engine.start_async(sync_job, i) for i in range(n)]
        return [await h.result(10) for h in handles]

    engines: list[durable.Engine] = []

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, max_workers=1) as engine:
            engines.append(engine)
            h = await engine.start_async(boss, 4, workflow_id="boss")
            assert await h.result(timeout=10) == [0, 3, 6, 9]

    run(main())


def test_many_async_workflows_on_one_loop_with_a_tiny_pool(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def part(i: int) -> int:
        await asyncio.sleep(0.01)
        return i

    @durable.workflow(registry=reg)
    async def fan(n: int) -> int:
        parts = await asyncio.gather(*(part(i) for i in range(n)))
        await durable.state.set_async({"n": n})
        return sum(parts)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, max_workers=1) as engine:
            handles = [await engine.start_async(fan, 5, workflow_id=f"f{i}") for i in range(60)]
            # Every one finishes (none starves for a connection); how fast is a benchmark's.
            results = await asyncio.gather(*(h.result(timeout=120) for h in handles))
            assert results == [10] * 60

    run(main())


@pytest.mark.parametrize("mode", ["async", "exit"])
def test_durability_modes_journal_parallel_steps_in_order(database_url: str, mode: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def ask(i: int) -> int:
        await asyncio.sleep((5 - i) * 0.01)
        return i

    @durable.workflow(registry=reg)
    async def fan() -> list[int]:
        first = await asyncio.gather(*(ask(i) for i in range(5)))
        await durable.sleep_async(0.05)
        await durable.state.set_async("half")
        second = await asyncio.gather(*(ask(i) for i in range(5, 8)))
        return [*first, *second]

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, durability=mode) as engine:
            h = await engine.start_async(fan, workflow_id="m")
            assert await h.result(timeout=10) == list(range(8))
            steps = engine.steps("m")
            assert [s.step_seq for s in steps] == list(range(len(steps)))
            outs = [s.output for s in steps if s.step_name.endswith("ask")]
            assert outs == [str(i) for i in range(8)]

    run(main())


def test_a_fake_clock_wakes_a_long_async_sleep(database_url: str) -> None:
    reg = durable.Registry()
    clock = durable.FakeClock()

    @durable.workflow(registry=reg)
    async def nap() -> str:
        await durable.sleep_async(3600)
        return "up"

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, clock=clock) as engine:
            h = await engine.start_async(nap, workflow_id="nap")
            while await h.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.02)
            clock.advance(3601)
            assert await h.result(timeout=8) == "up"

    run(main())


def test_messages_approvals_and_state_in_gather_branches(database_url: str) -> None:
    reg = durable.Registry()
    seen: list[Any] = []

    @durable.step(registry=reg)
    async def peek(tag: str) -> str:
        return tag

    @durable.workflow(registry=reg)
    async def wf() -> list[Any]:
        await durable.state.set_async({"k": 1})

        async def branch(tag: str) -> str:
            seen.append(durable.state.get())
            return await peek(tag)

        tags = await asyncio.gather(branch("a"), branch("b"))
        decision = await durable.approval_async("go", {"q": 1})
        msg = await durable.recv_async("m", timeout=10)
        return [*tags, decision.approved, msg]

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(wf, workflow_id="w")
            while await h.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(engine.decide, "w", "go", True)
            await engine.send_async("w", "hello", topic="m")
            assert await h.result(timeout=10) == ["a", "b", True, "hello"]
            assert seen and all(s == {"k": 1} for s in seen)  # also on each replay

    run(main())


def test_sync_children_of_many_async_parents_do_not_exhaust_the_sync_pool(
    database_url: str,
) -> None:
    """Sync child workflows reached with durable.to_thread run on the runner's threads
    (max_workers of them), each holding a connection of the engine's sync pool
    (max_workers + 4) for its whole run, so a child that starts a grandchild always finds
    a second connection: more children in flight than the pool has connections wait for
    a thread, never for a connection none will give back."""
    reg = durable.Registry()

    @durable.step(registry=reg)
    def nap(i: int) -> int:
        time.sleep(0.3)
        return i

    @durable.workflow(registry=reg)
    def grandchild(i: int) -> int:
        return nap(i)  # type: ignore[no-any-return]

    @durable.workflow(registry=reg)
    def mid(i: int) -> int:
        time.sleep(0.3)  # all of them hold their connection by now
        return grandchild(i)  # type: ignore[no-any-return]

    @durable.workflow(registry=reg)
    async def parent(i: int) -> int:
        return await durable.to_thread(mid, i)

    async def main() -> None:
        # Room in the loop's executor for the engine's own shutdown.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(16))
        async with durable.Engine(
            database_url, registry=reg, max_workers=1, grace_seconds=0.5
        ) as engine:
            engine.client.db._pool.timeout = 2  # fail in 2 s rather than psycopg_pool's 30
            began = time.monotonic()
            handles = [await engine.start_async(parent, i, workflow_id=f"p{i}") for i in range(8)]
            done, pending = await asyncio.wait(
                [asyncio.ensure_future(h.result(timeout=30)) for h in handles], timeout=30
            )
            took = time.monotonic() - began
            failures = [t.exception() for t in done if t.exception() is not None]
            for t in pending:
                t.cancel()
            # Before, every child stalled until the pool's timeout and the parents failed.
            assert not pending and not failures, (took, len(pending), failures[:1])
            assert sorted([await h.result() for h in handles]) == list(range(8))

    run(main())


def test_no_free_connection_for_a_sync_child_interrupts_its_parent_not_fails_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync child run (reached with durable.to_thread) whose connection checkout times
    out (the pool is busy for a moment) meets an outage, not a failure of its code: the
    parent must not journal the child as failed and end ERROR for good."""
    from psycopg_pool import PoolTimeout

    reg = durable.Registry()

    @durable.workflow(registry=reg)
    def kid() -> int:
        return 1

    @durable.workflow(registry=reg)
    async def parent() -> int:
        return await durable.to_thread(kid)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            pool = engine.client.db._pool  # the checkout itself times out, once, for the child
            real = pool.getconn
            busy = {"once": True}

            def getconn(*args: Any, **kwargs: Any) -> Any:
                import sys

                frame, names = sys._getframe(), set()
                while frame is not None:
                    names.add(frame.f_code.co_name)
                    frame = frame.f_back  # type: ignore[assignment]
                if busy["once"] and "execute_run" in names:
                    busy["once"] = False
                    raise PoolTimeout("couldn't get a connection after 30.00 sec")
                return real(*args, **kwargs)

            monkeypatch.setattr(pool, "getconn", getconn)
            h = await engine.start_async(parent, workflow_id="pt")
            try:
                await h.result(timeout=5)
            except Exception:
                pass
            assert not busy["once"]  # the timeout did happen
            info = await h.info()
            assert info.status != durable.WorkflowStatus.ERROR, info.error

    run(main())


def test_fork_of_an_async_workflow_replays_up_to_the_fork_point(database_url: str) -> None:
    reg = durable.Registry()
    calls: list[int] = []

    @durable.step(registry=reg)
    async def s(i: int) -> int:
        calls.append(i)
        return i

    @durable.workflow(registry=reg)
    async def wf() -> list[int]:
        return [await s(0), await s(1), await s(2)]

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(wf, workflow_id="orig")
            assert await h.result(timeout=10) == [0, 1, 2]
            calls.clear()
            fork = await asyncio.to_thread(engine.fork, "orig", from_step=2, new_id="forked")
            assert await durable.AsyncWorkflowHandle(engine.client, fork.workflow_id).result(
                10
            ) == [
                0,
                1,
                2,
            ]
            assert calls == [2]

    run(main())


def test_gathered_recvs_with_timeouts_replay_beside_a_step_that_ran_once(
    database_url: str,
) -> None:
    """Two recvs with timeouts and a step in one gather: the workflow parks, each message
    wakes it, and every replay finds each call at its position (the step runs once)."""
    reg = durable.Registry()
    ran: list[str] = []

    @durable.step(registry=reg)
    async def work(tag: str) -> str:
        ran.append(tag)
        return tag

    @durable.workflow(registry=reg)
    async def wf() -> list[Any]:
        return list(
            await asyncio.gather(
                durable.recv_async("a", timeout=120),
                durable.recv_async("b", timeout=120),
                work("w"),
            )
        )

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg, poll_interval=0.05) as engine:
            h = await engine.start_async(wf, workflow_id="recvs")
            while await h.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.02)
            await engine.send_async("recvs", "B", topic="b")
            await engine.send_async("recvs", "A", topic="a")
            assert await h.result(timeout=30) == ["A", "B", "w"]
            assert ran == ["w"]

    run(main())


def test_a_task_branch_that_parks_the_run_leaves_no_unretrieved_error(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A branch made with asyncio.create_task that the body never awaits parks the run:
    the suspension it raised ends the run, is nobody's to read, and is not logged by
    asyncio as 'Task exception was never retrieved'."""
    reg = durable.Registry()
    ran: list[str] = []

    @durable.step(registry=reg)
    async def work(tag: str) -> str:
        ran.append(tag)
        return tag

    async def later() -> None:
        await durable.sleep_async(1.5)  # long enough to suspend

    @durable.workflow(registry=reg)
    async def wf() -> str:
        asyncio.create_task(later())  # noqa: RUF006 - fire and forget, on purpose
        return await work("w")

    async def main() -> None:
        async with durable.Engine(
            database_url, registry=reg, poll_interval=0.05, worker=True
        ) as engine:
            h = await engine.start_async(wf, workflow_id="forget")
            assert await h.result(timeout=30) == "w"
            gc.collect()  # an unretrieved task error is logged when the task is collected

    with caplog.at_level("ERROR", logger="asyncio"):
        run(main())
    assert ran == ["w"]
    assert not [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
