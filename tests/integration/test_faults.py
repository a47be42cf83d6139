"""Faults around the database and the operator's tools, judged by stored rows, statuses
and exit codes (never by log lines): refused statements are failures, not outages; bad
URLs fail fast without the password; stored text is never markup; dead executors are
pruned; a worker whose LISTEN connection was cut looks for work at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from sqlalchemy import Connection, text

import durable
from durable import errors
from tests.acceptance.workers import start_worker, stop_worker
from tests.apps import counter_app


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def workflow_row(url: str, workflow_id: str, schema: str = "durable") -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        cur = conn.execute(
            f"SELECT status, epoch, recovery_attempts, owner, error FROM {schema}.workflows"
            " WHERE workflow_id = %s",
            [workflow_id],
        )
        found = cur.fetchone()
        assert found is not None, workflow_id
        assert cur.description is not None
        return dict(zip([c.name for c in cur.description], found, strict=True))


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- 2. only lost connections are outages ----------------------------------------------------


def _refused_app() -> tuple[durable.Registry, dict[str, Any]]:
    reg = durable.Registry()

    @durable.transaction(registry=reg, name="times_out")
    def times_out(conn: Connection) -> int:
        conn.execute(text("SET LOCAL statement_timeout = '50ms'"))
        conn.execute(text("SELECT pg_sleep(1)"))
        return 1

    @durable.transaction(registry=reg, name="waits_long")
    def waits_long(conn: Connection) -> int:
        conn.execute(text("SELECT pg_sleep(10) /* faults: cancel me */"))
        return 1

    @durable.step(registry=reg, name="costs_too_much")
    def costs_too_much() -> int:
        # More digits than PostgreSQL's numeric holds: the step's own record is refused.
        durable.charge(dollars=Decimal("1e200000"))
        return 1

    @durable.workflow(registry=reg, name="timing_out")
    def timing_out() -> int:
        return times_out()

    @durable.workflow(registry=reg, name="cancelled_query")
    def cancelled_query() -> int:
        return waits_long()

    @durable.workflow(registry=reg, name="overspending")
    def overspending() -> int:
        return costs_too_much()

    return reg, {"timing_out": timing_out, "cancelled": cancelled_query, "over": overspending}


def _assert_failed_for_good(engine: durable.Engine, url: str, workflow_id: str, epoch: int) -> None:
    """ERROR, and it stays so: no worker claims it again (the epoch stays put)."""
    stored = workflow_row(url, workflow_id)
    assert (stored["status"], stored["epoch"], stored["recovery_attempts"]) == ("ERROR", epoch, 0)
    time.sleep(0.5)  # ten polls of the worker
    assert workflow_row(url, workflow_id) == stored
    assert engine.runner.running_count() == 0


def test_a_statement_timeout_in_a_transaction_fails_the_workflow(database_url: str) -> None:
    reg, wfs = _refused_app()
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=1.0
    ) as engine:
        began = time.monotonic()
        handle = engine.start(wfs["timing_out"], workflow_id="st")
        with pytest.raises(errors.WorkflowFailedError, match="statement timeout") as info:
            handle.result(timeout=8)
        assert time.monotonic() - began < 5
        assert info.value.error_type == "sqlalchemy.exc.OperationalError"
        _assert_failed_for_good(engine, database_url, "st", epoch=1)
        (step,) = engine.steps("st")  # the failure is journaled: a replay raises it again
        assert step.step_name == "times_out" and step.error is not None


def test_a_cancelled_query_in_a_transaction_fails_the_workflow(database_url: str) -> None:
    reg, wfs = _refused_app()
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=1.0
    ) as engine:
        handle = engine.start(wfs["cancelled"], workflow_id="qc")
        with psycopg.connect(database_url, autocommit=True) as admin:

            def cancel() -> bool:
                row = admin.execute(
                    "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND state = 'active' AND query LIKE '%%faults: cancel me%%'"
                ).fetchone()
                return row == (1,)

            wait_until(cancel, timeout=5, what="the query to cancel")
            began = time.monotonic()
            with pytest.raises(errors.WorkflowFailedError, match="user request") as info:
                handle.result(timeout=8)
        assert time.monotonic() - began < 3  # not the ten seconds of the query
        assert info.value.error_type == "sqlalchemy.exc.OperationalError"
        _assert_failed_for_good(engine, database_url, "qc", epoch=1)


def test_a_refused_system_statement_fails_the_step_with_statement_error(
    database_url: str,
) -> None:
    reg, wfs = _refused_app()
    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=1.0
    ) as engine:
        handle = engine.start(wfs["over"], workflow_id="ov")
        with pytest.raises(errors.WorkflowFailedError, match="record_charged_step") as info:
            handle.result(timeout=8)
        assert info.value.error_type == "durable.errors.StatementError"
        assert "22003" in str(info.value)  # numeric value out of range, by SQLSTATE
        _assert_failed_for_good(engine, database_url, "ov", epoch=1)
        assert engine.steps("ov") == []  # nothing of the refused record was written


def test_a_refused_statement_raises_statement_error_inside_the_workflow(
    database_url: str,
) -> None:
    """The workflow's own code sees the refusal as a StatementError, and may handle it."""
    reg = durable.Registry()

    @durable.step(registry=reg, name="costs_too_much")
    def costs_too_much() -> int:
        durable.charge(dollars=Decimal("1e200000"))
        return 1

    @durable.step(registry=reg, name="fallback")
    def fallback() -> str:
        return "fallback"

    @durable.workflow(registry=reg, name="careful")
    def careful() -> str:
        try:
            costs_too_much()
        except errors.StatementError as exc:
            return f"{fallback()} after {exc.sqlstate}"
        return "charged"

    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(careful, workflow_id="cf").result(timeout=8) == "fallback after 22003"
        assert [s.step_name for s in engine.steps("cf")] == ["fallback"]


def test_a_lost_connection_in_a_transaction_is_an_outage_and_runs_again(
    database_url: str,
) -> None:
    """The counterpart: a connection lost mid-transaction interrupts the run (it is handed
    back and run again), and the transaction's rows commit once."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE paid (attempt int)")
    reg = durable.Registry()
    attempts: list[int] = []

    @durable.transaction(registry=reg, name="pay")
    def pay(conn: Connection) -> int:
        attempts.append(len(attempts) + 1)
        conn.execute(text("INSERT INTO paid VALUES (:n)"), {"n": len(attempts)})
        if len(attempts) == 1:
            conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return len(attempts)

    @durable.workflow(registry=reg, name="paying")
    def paying() -> int:
        return pay()

    with durable.Engine(
        database_url, registry=reg, worker=True, poll_interval=0.05, lease_seconds=1.0
    ) as engine:
        assert engine.start(paying, workflow_id="lost").result(timeout=10) == 2
    stored = workflow_row(database_url, "lost")
    assert (stored["status"], stored["recovery_attempts"]) == ("SUCCESS", 0)
    assert stored["epoch"] == 2  # handed back once, claimed again
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT attempt FROM paid").fetchall() == [(2,)]


async def refuse_writes(pool: Any) -> list[int]:
    """Every idle connection of an async pool now reaches a server that refuses writes (a
    demoted primary, a disk-full guard), while a new connection reaches one that takes
    them: what a pool holds after a failover. Returns their backend pids."""
    async with contextlib.AsyncExitStack() as stack:
        idle = pool.get_stats()["pool_available"]
        conns = [await stack.enter_async_context(pool.connection()) for _ in range(idle)]
        for conn in conns:
            await conn.execute("SET default_transaction_read_only = on")
        return [conn.info.backend_pid for conn in conns]


def test_an_async_runs_connection_refusing_writes_is_not_used_again(database_url: str) -> None:
    """A write refused because the server turned read-only is an outage: the run is
    interrupted, handed back and run again, and the connection the refusal came through is
    closed, not put back into the loop's pool (as a sync run's is), or every later run of
    that loop would be refused the same way and the workflow would never finish."""
    reg = durable.Registry()
    calls: list[int] = []

    @durable.step(registry=reg, name="note")
    async def note(i: int) -> int:
        calls.append(i)
        if i < 0:
            await asyncio.sleep(0.2)  # the warm runs overlap: each holds a connection
        return i

    @durable.workflow(registry=reg, name="noting")
    async def noting(i: int) -> int:
        return await note(i)

    def connected(pids: list[int]) -> list[int]:
        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
            ).fetchall()
        return [row[0] for row in rows]

    async def main() -> None:
        async with durable.Engine(
            database_url, registry=reg, worker=True, poll_interval=0.05
        ) as engine:
            # Three runs at once leave the loop's pool three connections: the start below
            # takes one of them (it is closed, and the start goes on another way), its run
            # another.
            warm = [await engine.start_async(noting, -k, workflow_id=f"warm{k}") for k in (1, 2, 3)]
            assert [await h.result(timeout=20) for h in warm] == [-1, -2, -3]
            host = await engine.runner.async_side.here()  # type: ignore[union-attr]
            async with contextlib.AsyncExitStack() as stack:  # however the runs overlapped
                for _ in range(3):
                    await stack.enter_async_context(host._pool.connection())
            refusing = await refuse_writes(host._pool)
            assert len(refusing) >= 2
            handle = await engine.start_async(noting, 1, workflow_id="after")
            assert await handle.result(timeout=30) == 1
            # Each refusing connection interrupted one run at most (none, when the refusal
            # met the step's record: that write is sent again on another connection at the
            # same epoch), and is gone: closed by the client, its backend exits a moment
            # later (under load, after the run's result is in); one put back into the pool
            # would stay.
            stored = workflow_row(database_url, "after")
            assert (stored["status"], stored["recovery_attempts"]) == ("SUCCESS", 0)
            assert 1 <= stored["epoch"] <= 1 + len(refusing)
            deadline = time.monotonic() + 15
            while left := await asyncio.to_thread(connected, refusing):
                assert time.monotonic() < deadline, f"refusing connections kept: {left}"
                await asyncio.sleep(0.05)

    asyncio.run(main())
    assert sorted(calls[:3]) == [-3, -2, -1] and set(calls[3:]) == {1}


def test_an_effect_key_too_long_for_its_index_is_refused_at_the_call(database_url: str) -> None:
    reg = durable.Registry()
    calls: list[str] = []
    long_key = secrets.token_hex(4000)  # 8000 bytes that do not compress

    @durable.effect(registry=reg, name="keyed", idempotent=True, key=lambda key: key)
    def keyed(key: str, *, idempotency_key: str) -> int:
        calls.append(idempotency_key)
        return 1

    @durable.workflow(registry=reg, name="long_key")
    def long_key_wf(key: str) -> int:
        return keyed(key)

    with durable.Engine(database_url, registry=reg) as engine:
        with pytest.raises(errors.WorkflowFailedError) as info:
            engine.start(long_key_wf, long_key, workflow_id="lk").result(timeout=8)
        assert calls == []
        assert info.value.error_type == "durable.errors.InvalidNameError"
        assert engine.client.effects("lk") == []


# -- 4. bad URLs fail fast, and never show the password ----------------------------------------


class RefusingServer:
    """A PostgreSQL server as far as a client can tell, which asks for a password and
    refuses it (the local server trusts 127.0.0.1, so it cannot be made to refuse one).
    With `echo`, its refusal quotes the password it got, as a careless proxy might."""

    def __init__(self, *, echo: bool) -> None:
        self.echo = echo
        self.received: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="refusing-server")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    self._refuse(conn)
                except (OSError, struct.error):
                    pass

    @staticmethod
    def _read(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("client went away")
            data += chunk
        return data

    def _refuse(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        while True:
            (length,) = struct.unpack("!I", self._read(conn, 4))
            (code,) = struct.unpack("!I", self._read(conn, length - 4)[:4])
            if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: no
                conn.sendall(b"N")
                continue
            break  # the startup message
        conn.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
        self._read(conn, 1)  # 'p'
        (length,) = struct.unpack("!I", self._read(conn, 4))
        password = self._read(conn, length - 4).rstrip(b"\0").decode()
        self.received.append(password)
        message = 'password authentication failed for user "app"'
        if self.echo:
            message += f' (password "{password}")'
        fields = b"SFATAL\0VFATAL\0C28P01\0M" + message.encode() + b"\0\0"
        conn.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)


@pytest.fixture
def refusing_server(request: pytest.FixtureRequest) -> Iterator[RefusingServer]:
    server = RefusingServer(echo=request.param == "echo")
    yield server
    server.close()


def _pieces(secret: str) -> list[str]:
    """The password, its percent-encoded form, and each part of it between / and @."""
    parts = [p for p in re.split(r"[/@]", secret) if len(p) >= 4]
    return [secret, quote(secret, safe=""), *parts]


def _assert_fails_without_secret(url: str, secret: str, *, expect: str, within: float) -> None:
    """durable.Client(url).connect() and `durable workflows list` both fail with a
    DurableError naming no part of the password, fast, and leave no thread behind."""
    before = set(threading.enumerate())
    client = durable.Client(url)
    began = time.monotonic()
    with pytest.raises(errors.DurableError) as info:
        client.connect()
    elapsed = time.monotonic() - began
    client.close()
    message = str(info.value)
    leaked = [p for p in _pieces(secret) if p in message]
    assert not leaked, message
    assert re.search(expect, message), message
    assert elapsed < within, elapsed
    time.sleep(0.1)
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []

    began = time.monotonic()
    out = cli("workflows", "list", "--database-url", url)
    elapsed = time.monotonic() - began
    assert out.returncode == 1, (out.stdout, out.stderr)
    # The database it uses (redacted) is named first, then the error: nothing else.
    lines = out.stderr.splitlines()
    assert lines[0].startswith("using ") and lines[-1].startswith("error: "), out.stderr
    assert out.stdout == ""
    leaked = [p for p in _pieces(secret) if p in out.stderr + out.stdout]
    assert not leaked, out.stderr
    assert re.search(expect, out.stderr), out.stderr
    assert elapsed < within + 5, elapsed  # the same, plus starting Python


URL_CASES = {
    # A raw "/" in the password: libpq reads the host as "postgres" and the port as "Xy9q".
    "raw-slash": ("postgresql://postgres:{pw}@127.0.0.1:5432/postgres", "Xy9q/Zk8w-Lp", "."),
    # A raw "@": libpq takes "Xy9q" for the password and "Zk8w-Lp@127.0.0.1" for the host.
    "raw-at": ("postgresql://postgres:{pw}@127.0.0.1:5432/postgres", "Xy9q@Zk8w-Lp", "."),
    "bad-port": ("postgresql://postgres:{pw}@127.0.0.1:54x2/postgres", "Xy9q-Zk8w-Lp", "port"),
    "missing-database": (
        "postgresql://postgres:{pw}@127.0.0.1:5432/durable_missing_" + uuid.uuid4().hex[:8],
        "Xy9q-Zk8w-Lp",
        "does not exist",
    ),
}


@pytest.mark.parametrize(
    "case",
    [
        "raw-slash",
        "raw-at",
        "bad-port",
        "missing-database",
    ],
)
def test_a_bad_url_fails_fast_without_the_password(case: str) -> None:
    template, secret, expect = URL_CASES[case]
    url = template.format(pw=secret)
    # A missing database is said at once: it is not retried for the connect timeout.
    _assert_fails_without_secret(url, secret, expect=expect, within=2.0)


@pytest.mark.parametrize("refusing_server", ["plain", "echo"], indirect=True)
def test_a_wrong_password_fails_at_once_without_the_password(
    refusing_server: RefusingServer,
) -> None:
    secret = "s3cr/t@pw Zq9"
    url = f"postgresql://app:{quote(secret, safe='')}@127.0.0.1:{refusing_server.port}/app"
    _assert_fails_without_secret(url, secret, expect="password authentication failed", within=2)
    # The password really was sent, and refused (twice: the Client, then the command).
    assert refusing_server.received == [secret, secret]


# -- 5. stored text is printed as it is, never as markup ------------------------------------------


def test_workflows_show_prints_markup_in_inputs_literally(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="echo")
    def echo(value: str) -> str:
        return value

    value = "[/bold] then [link=http://example.com]x[/link] and [red]red[/red]"
    with durable.Engine(database_url, registry=reg) as engine:
        assert engine.start(echo, value, workflow_id="mk").result(timeout=10) == value
    env = dict(os.environ)
    env.update(COLUMNS="200", FORCE_COLOR="1", TTY_COMPATIBLE="1")  # as on a terminal
    env.pop("NO_COLOR", None)
    out = cli("workflows", "show", "mk", "--database-url", database_url, env=env)
    assert out.returncode == 0, out.stderr
    assert value in out.stdout
    assert "\x1b]8;" not in out.stdout  # no hyperlink the operator never saw


# -- 6. executors that stopped long ago are pruned --------------------------------------------


def test_the_worker_prunes_dead_executors_that_own_nothing(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for executor_id, age in [
            ("dead-1", "2 days"),
            ("dead-2", "1 hour"),
            ("dead-owner", "2 days"),
            ("recent", "1 minute"),
        ]:
            conn.execute(
                "INSERT INTO durable.executors (executor_id, hostname, pid, started_at,"
                " heartbeat_at) VALUES (%s, 'gone-host', 4242, now() - interval '3 days',"
                " now() - %s::interval)",
                [executor_id, age],
            )
        # A workflow the dead executor still owns (of code this worker does not have).
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs, owner, epoch,"
            " lease_expires_at) VALUES ('held', 'someone.elses', 'RUNNING',"
            " '{\"args\": [], \"kwargs\": {}}', 'dead-owner', 1, now() + interval '1 hour')"
        )

    def executors() -> set[str]:
        with psycopg.connect(database_url) as conn:
            return {r[0] for r in conn.execute("SELECT executor_id FROM durable.executors")}

    reg = durable.Registry()
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        wait_until(lambda: "dead-1" not in executors(), timeout=5, what="the prune")
        assert executors() == {engine.executor_id, "dead-owner", "recent"}
    assert workflow_row(database_url, "held")["owner"] == "dead-owner"


def test_durable_worker_runs_workflows_of_another_schema(
    database_url: str, subprocess_env: dict[str, str]
) -> None:
    migrated = cli("migrate", "--schema", "other", "--database-url", database_url)
    assert migrated.returncode == 0, migrated.stderr
    counter_app.setup(database_url)
    worker = start_worker(subprocess_env, database_url, extra=["--schema", "other"])
    try:
        with durable.Client(database_url, schema="other") as client:
            handle = client.submit(counter_app.three_steps, "o1", workflow_id="o1")
            assert handle.result(timeout=15) == ["S1", "S2", "S3"]
            assert len(client.executors()) == 1  # the worker registered in its schema
    finally:
        stop_worker(worker)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM durable.workflows").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM durable.executors").fetchone() == (0,)
    assert workflow_row(database_url, "o1", schema="other")["status"] == "SUCCESS"


# -- 7. after LISTEN reconnects, the worker looks for work at once -------------------------------


def test_after_listen_reconnects_the_worker_polls_at_once(database_url: str) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="quick")
    def quick(x: int) -> int:
        return x + 1

    def listening() -> int:
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'LISTEN%%'"
            ).fetchone()
        return 0 if row is None else int(row[0])

    # A poll every 30 s: within the test only a notification or the reconnect finds work.
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=30) as engine:
        wait_until(lambda: listening() == 1, timeout=5, what="the worker to LISTEN")
        time.sleep(0.3)  # the worker's first rounds are over: it waits for a wake-up
        with psycopg.connect(database_url, autocommit=True) as admin:
            # Wait (up to 5 s) until the backend is gone, so the NOTIFY below reaches nobody.
            killed = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))"
                " FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'LISTEN%%'"
            ).fetchone()
        assert killed == (1,)
        began = time.monotonic()
        with durable.Client(database_url) as client:
            handle = client.submit(quick, 1, workflow_id="q1")
            assert handle.result(timeout=10) == 2
        assert time.monotonic() - began < 5
        assert engine.retrieve("q1").status() == "SUCCESS"
