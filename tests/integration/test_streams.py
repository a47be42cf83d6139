"""Streams in one process: a replay writes nothing again, readers stop at the close or
when the workflow finished, the async reader follows live, and bad input is refused with
nothing stored."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

import durable
from durable import errors


def test_a_replay_writes_nothing_twice_and_readers_stop_at_the_end(database_url: str) -> None:
    reg = durable.Registry()
    fail = {"once": True}

    @durable.step(registry=reg)
    def flaky() -> None:
        if fail["once"]:
            raise RuntimeError("after three values")

    @durable.workflow(registry=reg)
    def writer() -> int:
        offsets = [durable.write_stream("tokens", t) for t in ("a", "b", "c")]
        flaky()
        durable.write_stream("tokens", "d")
        return offsets[-1]

    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowFailedError):
            engine.start(writer, workflow_id="w").result(timeout=10)
        # Not closed, but the workflow finished: a reader stops after what is there.
        assert list(engine.read_stream("w", "tokens")) == ["a", "b", "c"]
        fail["once"] = False
        assert engine.resume("w").result(timeout=10) == 2
        assert list(engine.read_stream("w", "tokens")) == ["a", "b", "c", "d"]
        assert list(engine.read_stream("w", "tokens", offset=2)) == ["c", "d"]
        assert list(engine.read_stream("w", "other")) == []


def test_the_async_reader_follows_an_async_writer_live(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg)
    async def talker(n: int) -> None:
        for i in range(n):
            await asyncio.sleep(0.02)
            await durable.write_stream_async("out", i)
        await durable.close_stream_async("out")

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            await engine.start_async(talker, 20, workflow_id="t")
            got = [v async for v in engine.read_stream_async("t", "out", poll_interval=5)]
            assert got == list(range(20))  # live: LISTEN woke it, polling every 5 s could not

    asyncio.run(main())


def listening(url: str, channel: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query = %s",
            [f'LISTEN "{channel}"'],
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_readers_listen_connection_shows_the_database_is_back(
    database_url: str, asynchronous: bool
) -> None:
    """A new connection proves that the system database answers again: a pooled one does,
    and so does a stream reader's LISTEN connection, sync or async. A reader that connects
    while its process counts an outage ends that outage."""
    reg = durable.Registry()

    @durable.workflow(registry=reg)
    def speaker() -> None:
        durable.recv("go")
        durable.write_stream("out", "x")
        durable.close_stream("out")

    with (
        durable.Engine(database_url, registry=reg) as engine,
        # A LISTEN connection is what this is about: asked for, also under DURABLE_LISTEN=0.
        durable.Client(database_url, listen=True) as reader,
    ):
        engine.start(speaker, workflow_id="s")
        outage = reader.db.outage
        assert outage.lost(psycopg.OperationalError("server closed the connection"), "test")

        def read() -> list[Any]:
            if not asynchronous:
                return list(reader.read_stream("s", "out", poll_interval=0.05))

            async def collect() -> list[Any]:
                return [v async for v in reader.read_stream_async("s", "out", poll_interval=0.05)]

            return asyncio.run(collect())

        with ThreadPoolExecutor(1) as pool:
            got = pool.submit(read)
            deadline = time.monotonic() + 20
            while not listening(database_url, reader._stream_channel):
                assert time.monotonic() < deadline, "the reader never listened"
                time.sleep(0.02)
            engine.send("s", 1, topic="go")
            assert got.result(timeout=20) == ["x"]
        assert outage.down_since is None


def test_bad_stream_input_is_refused_and_nothing_is_stored(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg)
    def after_close() -> None:
        durable.write_stream("s", 1)
        durable.close_stream("s")
        durable.write_stream("s", 2)

    @durable.workflow(registry=reg)
    def bad_key() -> None:
        durable.write_stream("", 1)

    @durable.workflow(registry=reg)
    def too_big() -> None:
        durable.write_stream("s", "x" * 5000)

    @durable.step(registry=reg)
    def in_a_step() -> None:
        durable.write_stream("s", 1)

    @durable.workflow(registry=reg)
    def from_step() -> None:
        in_a_step()

    with durable.Engine(database_url, registry=reg, max_payload_bytes=1000) as engine:
        cases: list[tuple[Any, str]] = [
            (after_close, "StreamClosedError"),
            (bad_key, "InvalidNameError"),
            (too_big, "PayloadTooLargeError"),
            (from_step, "NoEngineError"),
        ]
        for fn, error in cases:
            with pytest.raises(errors.WorkflowFailedError, match=error):
                engine.start(fn, workflow_id=fn.__name__).result(timeout=10)
        assert list(engine.read_stream("after_close", "s")) == [1]
        for wid in ("bad_key", "too_big", "from_step"):
            assert list(engine.read_stream(wid, "s")) == []
        with pytest.raises(errors.WorkflowNotFoundError):
            list(engine.read_stream("nope", "s"))
        with pytest.raises(errors.ConfigurationError, match="offset"):
            list(engine.read_stream("after_close", "s", offset=-1))
    with pytest.raises(errors.NoEngineError):
        durable.write_stream("s", 1)


# -- events set from a step's code ----------------------------------------------------------------


def test_a_step_sets_an_event_at_once_and_again_when_it_runs_again(database_url: str) -> None:
    """Published while the step runs (a reader sees it before the step ends); an attempt
    that fails after setting it sets it again, and readers see the latest value; a fork
    from after the step has it."""
    reg = durable.Registry()
    attempts: list[int] = []
    seen: list[Any] = []

    @durable.step(registry=reg, retries=1, initial_delay=0.01)
    def work(n: int) -> int:
        attempts.append(n)
        durable.set_event("progress", {"attempt": len(attempts)})
        seen.append(durable.get_event(durable.workflow_id(), "progress"))
        if len(attempts) == 1:
            raise RuntimeError("crashed after the event")
        return n

    @durable.workflow(registry=reg)
    def job() -> int:
        done = work(7)
        durable.set_event("done", True)
        return done

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(job, workflow_id="j").result(timeout=10) == 7
        assert seen == [{"attempt": 1}, {"attempt": 2}]
        assert engine.client.events("j") == {"progress": {"attempt": 2}, "done": True}
        # No journal row of its own: the step's record is its journal.
        assert [(s.step_seq, s.kind) for s in engine.steps("j")] == [(0, "step"), (1, "event")]
        fork = engine.fork("j", from_step=1, new_id="j-fork")
        assert fork.result(timeout=10) == 7
        assert engine.client.events("j-fork") == {"progress": {"attempt": 2}, "done": True}
        assert len(attempts) == 2  # the fork replayed the step


def test_an_async_step_sets_an_event_awaited(database_url: str) -> None:
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def report() -> str:
        await durable.set_event_async("progress", "half")
        return "ok"

    @durable.workflow(registry=reg)
    async def job() -> str:
        return await report()

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            handle = await engine.start_async(job, workflow_id="a")
            assert await handle.result(timeout=10) == "ok"
            assert await engine.client.get_event_async("a", "progress") == "half"

    asyncio.run(main())


@pytest.mark.parametrize("what", ["send", "get_event", "set_event"])
def test_a_sync_send_or_event_call_in_an_async_step_is_a_blocking_call_error(
    database_url: str, what: str
) -> None:
    """It would hold the event loop, and every workflow on it, until the database answers:
    refused with the awaited twin to call instead, and nothing sent."""
    reg = durable.Registry()

    @durable.step(registry=reg)
    async def blocking() -> str:
        if what == "send":
            durable.send("other", "hello")
        elif what == "get_event":
            durable.get_event("other", "k")
        else:
            durable.set_event("progress", "blocked")
        return "unreachable"

    @durable.workflow(registry=reg)
    async def job() -> str:
        return await blocking()

    @durable.workflow(registry=reg)
    def other() -> None:
        pass

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            await (await engine.start_async(other, workflow_id="other")).result(timeout=10)
            handle = await engine.start_async(job, workflow_id="b")
            with pytest.raises(errors.WorkflowFailedError) as info:
                await handle.result(timeout=10)
            assert info.value.error_type == "durable.errors.BlockingCallError"
            assert f"await durable.{what}_async" in info.value.error_message
            assert engine.client.events("b") == {}

    asyncio.run(main())
