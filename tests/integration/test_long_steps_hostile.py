"""Long steps, and a workflow's recovery limit, at their seams against a real database:
what a given-up attempt's thread does after the step moved on (it charges the money its
call cost), a heartbeat from a thread the step's code started, an earlier attempt's
heartbeat refused late, and the bounds of `timeout=`, `heartbeat_timeout=` and
`max_recovery_attempts=`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime as dt
import threading
import time
from typing import Any

import pytest

import durable
from durable import errors
from durable._run import heartbeats as _heartbeats


def _wait_for(predicate: Any, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_the_charge_of_a_given_up_attempt_that_returns_late_is_counted(
    database_url: str,
) -> None:
    reg = durable.Registry()
    release = threading.Event()
    late_charged = threading.Event()
    vendor: list[str] = []

    @durable.step(retries=1, initial_delay=0, jitter=0, timeout=0.3, registry=reg)
    def ask_model() -> str:
        if not vendor:
            vendor.append("first call")  # paid for, however late it returns
            release.wait(30)
            durable.charge(dollars=0.5)
            late_charged.set()
            return "first"
        vendor.append("second call")
        durable.charge(dollars=0.5)
        return "second"

    @durable.step(registry=reg)
    def after() -> str:
        return "after"

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=10.0))
    def agent() -> str:
        answer = ask_model()
        release.set()  # the given-up attempt's call returns, and charges, now
        late_charged.wait(30)
        return answer + after()

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(agent, workflow_id="agent").result(timeout=30) == "secondafter"
        assert vendor == ["first call", "second call"]
        ledger = engine.budget("agent")
        assert ledger is not None
        # Both calls were paid for: $1.00 spent, not the $0.50 the recorded attempt charged.
        assert ledger["spent"]["dollars"] == 1.0


def test_a_heartbeat_from_a_thread_the_step_started_counts_or_is_refused_clearly(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.step(heartbeat_timeout=0.5, registry=reg)
    def crawl(pages: int) -> int:
        done: list[int] = []
        errors_seen: list[BaseException] = []

        def work() -> None:
            try:
                for page in range(pages):
                    time.sleep(0.1)
                    done.append(page)
                    durable.heartbeat(page)
            except BaseException as exc:
                errors_seen.append(exc)

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        if errors_seen:
            raise errors_seen[0]
        return len(done)

    @durable.workflow(registry=reg)
    def job() -> int:
        return crawl(15)

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="crawl")
        try:
            result = handle.result(timeout=30)
        except errors.WorkflowFailedError as exc:
            # Acceptable: an error naming the cause (no step in this thread's context).
            assert "HeartbeatTimeoutError" not in exc.error_type, str(exc)
        else:
            assert result == 15


def test_a_heartbeat_from_a_thread_without_the_steps_context_is_refused_by_name(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.step(heartbeat_timeout=5, registry=reg)
    def crawl() -> str:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pool.submit(durable.heartbeat, 1).result()
        return "beat"

    @durable.workflow(registry=reg)
    def job() -> str:
        return crawl()

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="no-context")
        with pytest.raises(errors.WorkflowFailedError) as failed:
            handle.result(timeout=30)
        assert failed.value.error_type.endswith("NotInStepError"), failed.value.error_type
        assert "copy_context().run" in str(failed.value)


def test_a_pool_running_in_copies_of_the_steps_context_heartbeats_for_the_step(
    database_url: str,
) -> None:
    reg = durable.Registry()
    attempts: list[Any] = []

    @durable.step(heartbeat_timeout=0.5, retries=1, registry=reg)
    def crawl(pages: int) -> int:
        attempts.append(durable.last_heartbeat())
        if len(attempts) > 1:
            return -1  # resumed: the first attempt was given up

        def page(n: int) -> int:
            time.sleep(0.1)
            durable.heartbeat(n)
            return n

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(contextvars.copy_context().run, page, n) for n in range(pages)]
            return len([f.result() for f in futures])

    @durable.workflow(registry=reg)
    def job() -> int:
        return crawl(40)  # 1 s of pages: past the heartbeat_timeout unless they heartbeat

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(job, workflow_id="pool").result(timeout=30) == 40
        assert attempts == [None]


@pytest.mark.parametrize("seconds", [float("inf"), 1e12, dt.timedelta.max])
@pytest.mark.parametrize("option", ["timeout", "heartbeat_timeout"])
def test_a_step_timeout_beyond_any_wait_is_refused_where_it_is_declared(
    option: str, seconds: float | dt.timedelta
) -> None:
    # Unrefused, a def step's attempt failed with OverflowError from its thread's wait, and
    # a heartbeat_timeout the database cannot add to a time broke every worker's sweep.
    reg = durable.Registry()
    with pytest.raises(errors.DefinitionError, match=f"{option}=.*at most 100 years"):

        @durable.step(registry=reg, **{option: seconds})
        def slow() -> str:
            time.sleep(0.05)
            return "ok"


def test_a_step_timeout_of_a_century_runs_the_step(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(timeout=dt.timedelta(days=36_500), heartbeat_timeout=3e9, registry=reg)
    def slow() -> str:
        time.sleep(0.05)
        durable.heartbeat("half")
        return "ok"

    @durable.workflow(registry=reg)
    def job() -> str:
        return slow()

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(job, workflow_id="century").result(timeout=30) == "ok"
        # The sweep reads the attempt's row without a time out of range.
        assert engine.client.db.fetch_all("expire_stuck_steps", {"slack": 1.5}) == []


def test_a_late_refused_heartbeat_of_an_earlier_attempt_does_not_stop_the_next(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An async step's heartbeat is written in the background. The first attempt's write
    # lands after the second attempt began, and is refused (an earlier attempt): that
    # refusal is not the second attempt's, which must run on (it was raised at the second
    # attempt's next heartbeat as StaleOwnerError, and the workflow stalled RUNNING).
    reg = durable.Registry()
    real = _heartbeats.drive_in_step_async
    writes: list[int] = []

    async def first_write_late(run: Any, gen: Any) -> Any:
        writes.append(1)
        if len(writes) == 1:
            await asyncio.sleep(1.0)  # slow to land: the retry begins meanwhile
        return await real(run, gen)

    monkeypatch.setattr(_heartbeats, "drive_in_step_async", first_write_late)
    attempts: list[int] = []

    @durable.step(heartbeat_timeout=10, retries=1, initial_delay=0, jitter=0, registry=reg)
    async def crawl() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            durable.heartbeat("first")
            raise RuntimeError("flaky")
        durable.heartbeat("second")
        await asyncio.sleep(1.5)  # the first attempt's write is refused meanwhile
        durable.heartbeat("third")
        return "done"

    @durable.workflow(registry=reg)
    async def job() -> str:
        return await crawl()

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(job, workflow_id="late-write").result(timeout=20) == "done"
        (record,) = engine.steps("late-write")
        assert record.attempts == 2


def test_a_recovery_limit_the_row_cannot_hold_is_refused_at_decoration(database_url: str) -> None:
    # Unrefused, every start failed with "integer out of range" from the insert.
    reg = durable.Registry()
    with pytest.raises(errors.DefinitionError, match=r"max_recovery_attempts=.*from 1 to"):
        durable.workflow(max_recovery_attempts=2**31, registry=reg)

    @durable.workflow(registry=reg, max_recovery_attempts=2**31 - 1)
    def job() -> str:
        return "ok"

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(job, workflow_id="limit").result(timeout=20) == "ok"
