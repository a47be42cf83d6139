"""Long steps in one process against a real database: `timeout=` on a def step gives an
attempt up (its thread's late result is never recorded, its late heartbeat refused);
`heartbeat_timeout=` gives up an attempt that stopped heartbeating, and the next attempt
resumes from the last heartbeat's details; a cancel reaches a def or an async def step at
its next heartbeat."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import durable
from durable import errors


def _wait_for(predicate: Any, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_a_def_step_past_its_timeout_is_given_up_and_its_late_result_never_recorded(
    database_url: str,
) -> None:
    reg = durable.Registry()
    release = threading.Event()
    seen: list[str] = []

    @durable.step(retries=1, initial_delay=0, jitter=0, timeout=0.3, registry=reg)
    def fetch() -> str:
        if not seen:
            seen.append("first began")
            release.wait(30)  # hangs past its timeout, until the test lets it go
            try:
                durable.heartbeat("late")
            except errors.StaleOwnerError:
                seen.append("late heartbeat refused")
            seen.append("first returned")
            return "first"
        seen.append("second began")
        return "second"

    @durable.workflow(registry=reg)
    def job() -> str:
        return fetch()

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="job")
        assert handle.result(timeout=20) == "second"
        (record,) = engine.steps("job")
        assert (record.output, record.attempts) == ('"second"', 2)
        release.set()  # the given-up attempt's thread returns now, for nobody
        _wait_for(lambda: "first returned" in seen, "the given-up attempt to return")
        assert seen == ["first began", "second began", "late heartbeat refused", "first returned"]
        (record,) = engine.steps("job")
        assert (record.output, record.attempts) == ('"second"', 2)
        # Nor was its heartbeat written: the step has no heartbeat row at all.
        row = engine.client.db.fetch_one(
            "last_step_heartbeat", {"workflow_id": "job", "step_seq": 0}
        )
        assert row is None


def test_a_def_step_out_of_retries_records_its_timeout(database_url: str) -> None:
    reg = durable.Registry()
    release = threading.Event()

    @durable.step(timeout=0.2, registry=reg)
    def hangs() -> str:
        release.wait(30)
        return "late"

    @durable.workflow(registry=reg)
    def job() -> str:
        return hangs()

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="hangs")
        with pytest.raises(errors.WorkflowFailedError, match="StepTimeoutError"):
            handle.result(timeout=20)
        release.set()
        (record,) = engine.steps("hangs")
        assert record.attempts == 1 and "timeout of 0.2 s" in (record.error or "")
        assert record.output is None


def test_a_def_step_that_stops_heartbeating_resumes_from_its_last_details(
    database_url: str,
) -> None:
    reg = durable.Registry()
    starts: list[Any] = []
    release = threading.Event()

    @durable.step(retries=2, initial_delay=0, jitter=0, heartbeat_timeout=0.5, registry=reg)
    def crawl(pages: int) -> list[int]:
        start = durable.last_heartbeat()
        starts.append(start)
        done = [] if start is None else list(range(start + 1))
        for page in range(0 if start is None else start + 1, pages):
            done.append(page)
            durable.heartbeat(page)
            if page == 3 and len(starts) == 1:
                release.wait(30)  # stuck: no heartbeat from here
        return done

    @durable.workflow(registry=reg)
    def job() -> list[int]:
        return crawl(6)

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="crawl")
        assert handle.result(timeout=20) == [0, 1, 2, 3, 4, 5]
        release.set()
        assert starts == [None, 3]  # the second attempt resumed after page 3
        (record,) = engine.steps("crawl")
        assert record.attempts == 2


def test_a_cancel_reaches_a_running_def_step_at_its_next_heartbeat(database_url: str) -> None:
    reg = durable.Registry()
    pages: list[int] = []
    stopped: list[str] = []

    @durable.step(registry=reg)
    def crawl() -> None:
        try:
            for page in range(100_000):
                time.sleep(0.01)  # a page's work: no await, no durable call
                pages.append(page)
                durable.heartbeat(page)
        except BaseException as exc:
            stopped.append(type(exc).__name__)
            raise

    @durable.workflow(registry=reg)
    def job() -> None:
        crawl()

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="cancel-def")
        _wait_for(lambda: len(pages) > 3, "the step to run")
        engine.cancel("cancel-def", reason="enough")
        with pytest.raises(errors.WorkflowCancelledError):
            handle.result(timeout=20)
        assert stopped == ["WorkflowInterrupted"]
        count = len(pages)
        time.sleep(0.1)
        assert len(pages) == count  # the step's loop is over
        assert engine.steps("cancel-def") == []


def test_a_cancel_reaches_a_running_async_step_at_its_next_heartbeat(database_url: str) -> None:
    reg = durable.Registry()
    pages: list[int] = []
    stopped: list[str] = []

    @durable.step(heartbeat_timeout=30, registry=reg)
    async def crawl() -> None:
        try:
            for page in range(100_000):
                time.sleep(0.01)  # CPU-bound work that never awaits
                pages.append(page)
                durable.heartbeat(page)
        except BaseException as exc:
            stopped.append(type(exc).__name__)
            raise

    @durable.workflow(registry=reg)
    async def job() -> None:
        await crawl()

    # A sync engine runs the async workflow on its loop's thread: the step's blocking
    # work holds that loop (nothing there could cancel it), not the test.
    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="cancel-async")
        _wait_for(lambda: len(pages) > 3, "the step to run")
        engine.cancel("cancel-async", reason="enough")
        with pytest.raises(errors.WorkflowCancelledError):
            handle.result(timeout=20)
        assert stopped == ["WorkflowInterrupted"]
        assert engine.steps("cancel-async") == []


def test_an_async_step_that_stops_heartbeating_resumes_from_its_last_details(
    database_url: str,
) -> None:
    reg = durable.Registry()
    starts: list[Any] = []

    @durable.step(retries=1, initial_delay=0, jitter=0, heartbeat_timeout=1.0, registry=reg)
    async def crawl(pages: int) -> list[int]:
        start = durable.last_heartbeat()
        starts.append(start)
        done = [] if start is None else list(range(start + 1))
        for page in range(0 if start is None else start + 1, pages):
            done.append(page)
            durable.heartbeat(page)
            await asyncio.sleep(0.01)
            if page == 3 and len(starts) == 1:
                await asyncio.sleep(60)  # stuck: no heartbeat from here
        return done

    @durable.workflow(registry=reg)
    async def job() -> list[int]:
        return await crawl(6)

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="crawl-async")
        assert handle.result(timeout=20) == [0, 1, 2, 3, 4, 5]
        assert starts == [None, 3]
        (record,) = engine.steps("crawl-async")
        assert record.attempts == 2


def test_a_def_step_of_an_async_workflow_that_stops_heartbeating_resumes(
    database_url: str,
) -> None:
    reg = durable.Registry()
    starts: list[Any] = []
    release = threading.Event()

    @durable.step(retries=1, initial_delay=0, jitter=0, heartbeat_timeout=1.0, registry=reg)
    def crawl(pages: int) -> list[int]:
        start = durable.last_heartbeat()
        starts.append(start)
        done = [] if start is None else list(range(start + 1))
        for page in range(0 if start is None else start + 1, pages):
            done.append(page)
            durable.heartbeat(page)
            if page == 3 and len(starts) == 1:
                release.wait(30)  # stuck: no heartbeat from here
        if len(starts) == 1:
            durable.heartbeat("late")  # refused: its attempt was given up
        return done

    @durable.workflow(registry=reg)
    async def job() -> list[int]:
        return await durable.to_thread(crawl, 6)

    with durable.Engine(database_url, registry=reg) as engine:
        handle = engine.start(job, workflow_id="crawl-thread")
        assert handle.result(timeout=20) == [0, 1, 2, 3, 4, 5]
        assert starts == [None, 3]
        release.set()
        (record,) = engine.steps("crawl-thread")
        assert (record.attempts, record.output) == (2, "[0,1,2,3,4,5]")
