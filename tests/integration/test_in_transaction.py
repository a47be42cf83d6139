"""Starts, enqueues and sends inside the application's own transaction (`conn=`): on
psycopg's and SQLAlchemy's connections and sessions, sync and async, the workflow and the
message exist once the application commits and never if it rolls back, and the workflow
runs once after the commit; another database needs an outbox."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import durable
from durable.errors import (
    ConfigurationError,
    NoOpenTransactionError,
    OutboxRequiredError,
    WorkflowNotFoundError,
)

reg = durable.Registry()
jobs = durable.Queue("txn.jobs", registry=reg)
URL: dict[str, str] = {}  # the test's database, for the step that counts runs


@durable.step(registry=reg)
def count_run(order_id: str) -> None:
    with psycopg.connect(URL["db"], autocommit=True) as conn:
        conn.execute("INSERT INTO runs (order_id) VALUES (%s)", [order_id])


@durable.step(registry=reg)
async def count_run_async(order_id: str) -> None:
    async with await psycopg.AsyncConnection.connect(URL["db"], autocommit=True) as conn:
        await conn.execute("INSERT INTO runs (order_id) VALUES (%s)", [order_id])


@durable.workflow(registry=reg, name="txn.fulfil")
def fulfil(order_id: str) -> str:
    count_run(order_id)
    paid = durable.recv("pay", timeout=30)
    return f"{order_id}:{paid}"


@durable.workflow(registry=reg, name="txn.fulfil_async")
async def fulfil_async(order_id: str) -> str:
    await count_run_async(order_id)
    paid = await durable.recv_async("pay", timeout=30)
    return f"{order_id}:{paid}"


def _setup(url: str) -> None:
    URL["db"] = url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (order_id text PRIMARY KEY)")
        conn.execute("CREATE TABLE runs (order_id text NOT NULL)")


def _world(url: str, order_id: str) -> dict[str, int]:
    """What the database holds of one order: its row, its workflow, its messages, its runs."""
    with psycopg.connect(url) as conn:

        def count(query: str) -> int:
            row = conn.execute(query, [order_id]).fetchone()
            assert row is not None
            return int(row[0])

        return {
            "orders": count("SELECT count(*) FROM orders WHERE order_id = %s"),
            "workflows": count(
                "SELECT count(*) FROM durable.workflows WHERE workflow_id = 'order-' || %s"
            ),
            "messages": count(
                "SELECT count(*) FROM durable.messages WHERE workflow_id = 'order-' || %s"
            ),
            "runs": count("SELECT count(*) FROM runs WHERE order_id = %s"),
        }


def _sa_url(url: str) -> str:
    """The test database's libpq URL (or key=value string) as a SQLAlchemy URL."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    return str(
        sqlalchemy.URL.create(
            "postgresql+psycopg",
            username=str(info.get("user") or "postgres"),
            password=str(info["password"]) if info.get("password") else None,
            host=str(info.get("host") or "127.0.0.1"),
            port=int(info.get("port") or 5432),
            database=str(info["dbname"]),
        ).render_as_string(hide_password=False)
    )


NOTHING = {"orders": 0, "workflows": 0, "messages": 0, "runs": 0}


# -- sync: psycopg Connection, SQLAlchemy Connection and Session -------------------------


def _in_transaction(form: str, url: str, commit: bool, body: Callable[[Any], Any]) -> Any:
    """Run `body(conn)` in one application transaction of `form`, then commit or roll back."""
    if form == "psycopg":
        with psycopg.connect(url) as conn:
            done = body(conn)
            conn.commit() if commit else conn.rollback()
            return done
    engine = sqlalchemy.create_engine(_sa_url(url))
    try:
        if form == "sqlalchemy":
            with engine.connect() as sa_conn:
                done = body(sa_conn)
                sa_conn.commit() if commit else sa_conn.rollback()
                return done
        with Session(engine) as session:
            done = body(session)
            session.commit() if commit else session.rollback()
            return done
    finally:
        engine.dispose()


def _insert_order(conn: Any, order_id: str) -> None:
    if isinstance(conn, psycopg.Connection):
        conn.execute("INSERT INTO orders VALUES (%s)", [order_id])
    else:
        conn.execute(sqlalchemy.text("INSERT INTO orders VALUES (:o)"), {"o": order_id})


@pytest.mark.parametrize("form", ["psycopg", "sqlalchemy", "session"])
def test_a_start_and_a_send_commit_or_roll_back_with_the_application(
    database_url: str, form: str
) -> None:
    _setup(database_url)
    with durable.Engine(database_url, registry=reg) as engine:

        def order(order_id: str) -> Callable[[Any], durable.WorkflowHandle]:
            def body(conn: Any) -> durable.WorkflowHandle:
                _insert_order(conn, order_id)
                handle = engine.start(fulfil, order_id, workflow_id=f"order-{order_id}", conn=conn)
                # Sent in the same transaction: the workflow it started counts as there.
                engine.send(handle.workflow_id, "paid", topic="pay", conn=conn)
                # Nobody else sees it (so nobody runs it) before the commit.
                assert _world(database_url, order_id) == NOTHING
                return handle

            return body

        _in_transaction(form, database_url, False, order("a"))
        assert _world(database_url, "a") == NOTHING
        with pytest.raises(WorkflowNotFoundError):
            engine.retrieve("order-a")

        handle = _in_transaction(form, database_url, True, order("b"))
        assert handle.result(timeout=30) == "b:paid"
        assert _world(database_url, "b") == {"orders": 1, "workflows": 1, "messages": 1, "runs": 1}


# -- async: psycopg AsyncConnection, SQLAlchemy AsyncConnection and AsyncSession ----------


async def _in_transaction_async(
    form: str, url: str, commit: bool, body: Callable[[Any], Awaitable[Any]]
) -> Any:
    if form == "psycopg":
        async with await psycopg.AsyncConnection.connect(url) as conn:
            done = await body(conn)
            await (conn.commit() if commit else conn.rollback())
            return done
    engine = create_async_engine(_sa_url(url))
    try:
        if form == "sqlalchemy":
            async with engine.connect() as sa_conn:
                done = await body(sa_conn)
                await (sa_conn.commit() if commit else sa_conn.rollback())
                return done
        async with AsyncSession(engine) as session:
            done = await body(session)
            await (session.commit() if commit else session.rollback())
            return done
    finally:
        await engine.dispose()


async def _insert_order_async(conn: Any, order_id: str) -> None:
    if isinstance(conn, psycopg.AsyncConnection):
        await conn.execute("INSERT INTO orders VALUES (%s)", [order_id])
    else:
        await conn.execute(sqlalchemy.text("INSERT INTO orders VALUES (:o)"), {"o": order_id})


@pytest.mark.parametrize("form", ["psycopg", "sqlalchemy", "session"])
def test_an_awaited_start_and_send_commit_or_roll_back_with_the_application(
    database_url: str, form: str
) -> None:
    _setup(database_url)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:

            def order(order_id: str) -> Callable[[Any], Awaitable[durable.AsyncWorkflowHandle]]:
                async def body(conn: Any) -> durable.AsyncWorkflowHandle:
                    await _insert_order_async(conn, order_id)
                    handle = await engine.start_async(
                        fulfil_async, order_id, workflow_id=f"order-{order_id}", conn=conn
                    )
                    await engine.send_async(handle.workflow_id, "paid", topic="pay", conn=conn)
                    assert _world(database_url, order_id) == NOTHING
                    return handle

                return body

            await _in_transaction_async(form, database_url, False, order("a"))
            assert _world(database_url, "a") == NOTHING

            handle = await _in_transaction_async(form, database_url, True, order("b"))
            assert await handle.result(timeout=30) == "b:paid"
        assert _world(database_url, "b") == {"orders": 1, "workflows": 1, "messages": 1, "runs": 1}

    asyncio.run(main())


# -- enqueue, misuse, another database ---------------------------------------------------


def test_an_enqueue_commits_or_rolls_back_with_the_application(database_url: str) -> None:
    _setup(database_url)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.1) as engine:
        for order_id, commit in (("a", False), ("b", True)):
            with psycopg.connect(database_url) as conn:
                _insert_order(conn, order_id)
                jobs.enqueue(fulfil, order_id, workflow_id=f"order-{order_id}", conn=conn)
                engine.send(f"order-{order_id}", "paid", topic="pay", conn=conn)
                conn.commit() if commit else conn.rollback()
        assert _world(database_url, "a") == NOTHING
        assert engine.retrieve("order-b").result(timeout=30) == "b:paid"
        assert _world(database_url, "b") == {"orders": 1, "workflows": 1, "messages": 1, "runs": 1}


@pytest.fixture
def other_database(bare_database_url: str) -> Iterator[str]:
    """An application database that is not durable's (no durable schema)."""
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (order_id text PRIMARY KEY)")
    yield bare_database_url


def test_a_connection_that_cannot_hold_the_start_is_refused_by_name(
    database_url: str, other_database: str
) -> None:
    _setup(database_url)
    with durable.Engine(database_url, registry=reg) as engine:
        # Autocommit: the row would commit at once, whatever the application does.
        with psycopg.connect(database_url, autocommit=True) as conn:
            with pytest.raises(NoOpenTransactionError):
                engine.start(fulfil, "a", workflow_id="order-a", conn=conn)
        # Another database, and no outbox configured.
        with psycopg.connect(other_database) as conn:
            _insert_order(conn, "a")
            with pytest.raises(OutboxRequiredError, match="outbox"):
                engine.start(fulfil, "a", workflow_id="order-a", conn=conn)
            conn.rollback()
        # The awaited kind to the plain call; and from workflow code, nothing of this.
        with pytest.raises(ConfigurationError, match="conn="):
            engine.start(fulfil, "a", conn=object())
        with pytest.raises(ConfigurationError, match="dedup_key"):
            with psycopg.connect(database_url) as conn:
                jobs.enqueue(fulfil, "a", dedup_key="k", conn=conn)
        # A message kept before its workflow is durable's own write, never the application's.
        with pytest.raises(ConfigurationError, match="before_start"):
            with psycopg.connect(database_url) as conn:
                engine.client.send("order-a", "x", before_start=True, conn=conn)
    assert _world(database_url, "a") == NOTHING


def test_the_outbox_carries_a_start_and_a_send_from_another_database(
    database_url: str, other_database: str
) -> None:
    _setup(database_url)
    app = other_database
    # Not a worker: its keeper drains the outbox while it waits for what it started there.
    with durable.Engine(database_url, registry=reg, outbox_url=app) as engine:
        with psycopg.connect(app) as conn:  # not installed yet: said by name
            with pytest.raises(OutboxRequiredError, match="install"):
                engine.start(fulfil, "a", workflow_id="order-a", conn=conn)
        engine.client.install_outbox()
        engine.client.install_outbox()  # idempotent
        for order_id, commit in (("a", False), ("b", True)):
            with psycopg.connect(app) as conn:
                _insert_order(conn, order_id)
                handle = engine.start(fulfil, order_id, workflow_id=f"order-{order_id}", conn=conn)
                engine.send(handle.workflow_id, "paid", topic="pay", conn=conn)
                conn.commit() if commit else conn.rollback()
        # The keeper drains the outbox: the workflow is in durable's database a moment
        # after the commit, and its handle then waits for it.
        deadline = time.monotonic() + 30
        while _world(database_url, "b")["workflows"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert handle.result(timeout=30) == "b:paid"
        assert engine.client.drain_outbox() == 0
    assert _world(database_url, "a") == {"orders": 0, "workflows": 0, "messages": 0, "runs": 0}
    assert _world(database_url, "b") == {"orders": 0, "workflows": 1, "messages": 1, "runs": 1}
    with psycopg.connect(app) as conn:
        assert conn.execute("SELECT count(*) FROM durable.outbox").fetchone() == (0,)
        assert conn.execute("SELECT order_id FROM orders").fetchall() == [("b",)]


def test_durable_outbox_install_makes_the_table_once(
    database_url: str, other_database: str
) -> None:
    from click.testing import CliRunner

    from durable.cli import main

    args = ["outbox", "install", "--url", other_database, "--database-url", database_url]
    for _ in range(2):  # idempotent
        done = CliRunner().invoke(main, args)
        assert done.exit_code == 0, done.output
    with psycopg.connect(other_database) as conn:
        assert conn.execute("SELECT count(*) FROM durable.outbox").fetchone() == (0,)
    drained = CliRunner().invoke(
        main, ["outbox", "drain", "--url", other_database, "--database-url", database_url]
    )
    assert drained.exit_code == 0, drained.output
    assert "0 row(s) moved" in drained.output


def test_a_connection_through_the_servers_socket_is_on_durables_database(
    database_url: str,
) -> None:
    """The same database reached another way (a Unix socket, where durable uses TCP) is
    recognised as durable's: the start goes in the transaction, not to an outbox."""
    socket_dir = "/var/run/postgresql"
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    if not os.path.exists(socket_dir) or str(info.get("host", "")).startswith("/"):
        pytest.skip("needs a local server's socket, and a database reached over TCP")
    _setup(database_url)
    by_socket = psycopg.conninfo.make_conninfo(database_url, host=socket_dir)
    with durable.Engine(database_url, registry=reg) as engine:
        with psycopg.connect(by_socket) as conn:
            engine.start(fulfil, "s", workflow_id="order-s", conn=conn)
            conn.rollback()
    assert _world(database_url, "s") == NOTHING
