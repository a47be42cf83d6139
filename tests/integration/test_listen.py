"""One LISTEN connection per client, shared by everything in it that waits for a
notification: stream readers (sync and async), watchers and the worker loop.

The readers here connect as a role with a CONNECTION LIMIT (a lowered connection budget)
and the connections that role holds are sampled from pg_stat_activity: 120 readers in one
process hold one LISTEN connection beside the pool and each sees every value; past the
limit, when no LISTEN connection can be had, they poll and still see every value, and the
listener comes back once the server lets it; a cut LISTEN connection is made again and the
readers waiting on it are woken; with DURABLE_LISTEN=0 nothing listens and all of them
poll. The writer is an Engine connected as the test's superuser, outside that budget.
The tests that need LISTEN ask for it (listen=True), so they hold under DURABLE_LISTEN=0."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import durable

READERS = 120
VALUES = 10

reg = durable.Registry()


@durable.workflow(registry=reg, name="listen.talker")
def talker(n: int) -> None:
    """Writes value 0, waits for "go", writes the rest and closes the stream."""
    durable.write_stream("out", 0)
    durable.recv("go", timeout=600)
    for i in range(1, n):
        durable.write_stream("out", i)
    durable.close_stream("out")


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def limited_role(url: str, limit: int) -> Iterator[tuple[str, str]]:
    """A role that may read durable's tables and hold at most `limit` connections (a
    superuser has no limit, so the readers are not one); yields (its URL, its name)."""
    name = f"durable_reader_{uuid.uuid4().hex[:8]}"
    role = sql.Identifier(name)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT {}").format(role, sql.Literal(limit))
        )
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA durable TO {}").format(role))
        admin.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA durable TO {}").format(role))
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["user"] = name
    try:
        yield psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in info.items()}), name
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = %s",
                [name],
            )
            admin.execute(sql.SQL("DROP OWNED BY {}").format(role))
            admin.execute(sql.SQL("DROP ROLE {}").format(role))


def set_limit(url: str, role: str, limit: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(
                sql.Identifier(role), sql.Literal(limit)
            )
        )


def held(url: str, role: str) -> tuple[int, list[int]]:
    """(connections `role` holds, pids of those LISTENing)."""
    with psycopg.connect(url) as admin:
        rows = admin.execute(
            "SELECT pid, query LIKE 'LISTEN%%' FROM pg_stat_activity WHERE usename = %s",
            [role],
        ).fetchall()
    return len(rows), [pid for pid, listening in rows if listening]


class Sampler:
    """Samples the connections a role holds until stopped: the most held at once."""

    def __init__(self, url: str, role: str) -> None:
        self.most = 0
        self.most_listening = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, role), daemon=True)
        self._thread.start()

    def _run(self, url: str, role: str) -> None:
        with psycopg.connect(url, autocommit=True) as admin:
            while not self._stop.is_set():
                row = admin.execute(
                    "SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN%%')"
                    " FROM pg_stat_activity WHERE usename = %s",
                    [role],
                ).fetchone()
                assert row is not None
                self.most = max(self.most, int(row[0]))
                self.most_listening = max(self.most_listening, int(row[1]))
                self._stop.wait(0.02)

    def stop(self) -> Sampler:
        self._stop.set()
        self._thread.join(timeout=10)
        return self


class Readers:
    """`count` readers of one stream in this process: half on threads (read_stream), half
    as tasks of one event loop (read_stream_async). Each records what it read, or its
    error."""

    def __init__(
        self, client: durable.Client, workflow_id: str, count: int, poll_interval: float
    ) -> None:
        self.got: list[list[Any]] = []
        self.errors: list[BaseException] = []
        self._client = client
        self._args = (workflow_id, "out")
        self._poll = poll_interval
        n_async = count // 2
        self._threads = [
            threading.Thread(target=self._read, daemon=True) for _ in range(count - n_async)
        ]
        self._threads.append(
            threading.Thread(target=lambda: asyncio.run(self._read_all(n_async)), daemon=True)
        )
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        try:
            self.got.append(list(self._client.read_stream(*self._args, poll_interval=self._poll)))
        except Exception as exc:
            self.errors.append(exc)

    async def _read_one(self) -> None:
        try:
            stream = self._client.read_stream_async(*self._args, poll_interval=self._poll)
            self.got.append([value async for value in stream])
        except Exception as exc:
            self.errors.append(exc)

    async def _read_all(self, n: int) -> None:
        await asyncio.gather(*(self._read_one() for _ in range(n)))

    def join(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "readers still waiting"


def started(engine: durable.Engine, workflow_id: str) -> None:
    """Start the talker and let it write value 0 and wait for "go"."""
    engine.start(talker, VALUES, workflow_id=workflow_id)
    wait_until(lambda: engine.retrieve(workflow_id).status() == "SUSPENDED", "the talker")


def subscribed(client: durable.Client, count: int) -> Callable[[], bool]:
    return lambda: client._listener.subscribers >= count


# -- 120 readers, one LISTEN connection ------------------------------------------------------


def test_120_readers_share_one_listen_connection_and_each_sees_every_value(
    database_url: str,
) -> None:
    # The pool (at most 4) and one LISTEN connection fit in 6; a connection per reader
    # does not.
    with (
        limited_role(database_url, limit=6) as (reader_url, role),
        durable.Engine(
            database_url, registry=reg, worker=True, poll_interval=0.1, listen=True
        ) as engine,
    ):
        started(engine, "t")
        with durable.Client(reader_url, listen=True) as client:
            sampler = Sampler(database_url, role)
            # Polling once in 10 minutes: only a notification brings the values in time.
            readers = Readers(client, "t", READERS, poll_interval=600)
            wait_until(
                lambda: readers.errors or client._listener.subscribers == READERS,
                "every reader to wait",
            )
            engine.send("t", "go", topic="go")
            readers.join()
            sampler.stop()
    assert readers.errors == []
    assert readers.got == [list(range(VALUES))] * READERS
    assert sampler.most_listening == 1
    assert sampler.most <= 6


# -- past the connection limit, readers poll -------------------------------------------------


def test_past_the_connection_limit_readers_poll_then_listen_again(database_url: str) -> None:
    with (
        limited_role(database_url, limit=3) as (reader_url, role),
        durable.Engine(
            database_url, registry=reg, worker=True, poll_interval=0.1, listen=True
        ) as engine,
    ):
        started(engine, "t1")
        started(engine, "t2")
        # Two connections of the role are taken elsewhere: the client's pool gets one, and
        # no LISTEN connection can be had.
        others = [psycopg.connect(reader_url) for _ in range(2)]
        try:
            with durable.Client(reader_url, listen=True) as client:
                sampler = Sampler(database_url, role)
                readers = Readers(client, "t1", READERS, poll_interval=1.0)
                wait_until(
                    lambda: readers.errors or client._listener.subscribers == READERS,
                    "every reader to wait",
                )
                engine.send("t1", "go", topic="go")
                readers.join()
                sampler.stop()
                assert readers.errors == []
                assert readers.got == [list(range(VALUES))] * READERS
                assert sampler.most_listening == 0  # every one of them polled

                # Readers that poll once in 10 minutes wait, with no LISTEN connection yet;
                # the server lets the role have more: the listener connects, wakes them,
                # and they follow live.
                live = Readers(client, "t2", 10, poll_interval=600)
                wait_until(
                    lambda: live.errors or client._listener.subscribers == 10,
                    "every reader to wait",
                )
                assert held(database_url, role)[1] == []
                set_limit(database_url, role, 10)
                wait_until(lambda: len(held(database_url, role)[1]) == 1, "a LISTEN connection")
                engine.send("t2", "go", topic="go")
                live.join()
                assert live.errors == []
                assert live.got == [list(range(VALUES))] * 10
        finally:
            for conn in others:
                conn.close()


# -- a cut LISTEN connection is made again ---------------------------------------------------


def test_readers_keep_following_after_their_listen_connection_is_cut(database_url: str) -> None:
    with (
        limited_role(database_url, limit=6) as (reader_url, role),
        durable.Engine(
            database_url, registry=reg, worker=True, poll_interval=0.1, listen=True
        ) as engine,
    ):
        started(engine, "t")
        with durable.Client(reader_url, listen=True) as client:
            readers = Readers(client, "t", READERS, poll_interval=600)
            wait_until(
                lambda: readers.errors or client._listener.subscribers == READERS,
                "every reader to wait",
            )
            [before] = held(database_url, role)[1]
            # One more subscriber, kept to the end: once the readers are done, nobody else
            # waits and the listener lets its connection go before the look below.
            kept = client._listener.subscribe(client._notify_channel)
            with psycopg.connect(database_url, autocommit=True) as admin:
                # Wait (up to 5 s) until the backend is gone: the NOTIFY of the values
                # below may reach nobody, and only the reconnect can wake the readers.
                cut = admin.execute("SELECT pg_terminate_backend(%s, 5000)", [before]).fetchone()
            assert cut == (True,)
            engine.send("t", "go", topic="go")
            readers.join()
            _, after = held(database_url, role)
            kept.close()
    assert readers.errors == []
    assert readers.got == [list(range(VALUES))] * READERS
    assert len(after) == 1 and after != [before]


# -- the worker, watchers and readers of one engine share it ---------------------------------


def test_an_engines_worker_watcher_and_readers_share_one_listen_connection(
    database_url: str,
) -> None:
    def listening() -> int:
        with psycopg.connect(database_url) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'LISTEN%%'"
            ).fetchone()
        assert row is not None
        return int(row[0])

    payloads: list[str] = []
    stop = threading.Event()
    # A poll every 10 minutes: only a notification wakes the worker within the test.
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=600, listen=True
    ) as engine:

        def watch() -> None:
            with engine.client._notifications() as notified:
                while not stop.is_set() and "t" not in payloads:
                    payloads.extend(notified.wait(600))

        started(engine, "t")
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        readers = Readers(engine, "t", 4, poll_interval=600)
        wait_until(subscribed(engine.client, 1 + 1 + 4), "the worker, the watcher and the readers")
        assert listening() == 1
        engine.send("t", "go", topic="go")
        readers.join()
        watcher.join(timeout=60)
        stop.set()
        assert listening() == 1
    assert readers.errors == []
    assert readers.got == [list(range(VALUES))] * 4
    assert "t" in payloads


# -- polling only --------------------------------------------------------------------------


def test_with_listen_off_120_readers_poll_and_each_sees_every_value(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_LISTEN", "0")
    with (
        limited_role(database_url, limit=5) as (reader_url, role),
        durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.1) as engine,
    ):
        started(engine, "t")
        with durable.Client(reader_url) as client:
            sampler = Sampler(database_url, role)
            readers = Readers(client, "t", READERS, poll_interval=1.0)
            engine.send("t", "go", topic="go")
            readers.join()
            sampler.stop()
    assert readers.errors == []
    assert readers.got == [list(range(VALUES))] * READERS
    assert sampler.most_listening == 0
