"""The system database's connections, the same through both drivers' checkouts
(SystemDB.connection for sync runs, SystemDB.async_connection for an event loop's): a
checkout that cannot be had is an outage, and a connection an outage came through is
closed rather than handed to the next run."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import sql

import durable
from durable import errors
from durable._io.systemdb import SystemDB


def test_a_checkout_from_a_closed_pool_is_an_outage_in_both_drivers(database_url: str) -> None:
    db = SystemDB(database_url, "durable")
    db.open()
    db.close()
    with pytest.raises(errors.DatabaseUnavailableError, match="checkout"):
        with db.connection():
            pass

    async def checkout() -> None:
        pool = db.async_pool(2)
        await pool.open(wait=True)
        await pool.close()
        async with db.async_connection(pool):
            pass

    with pytest.raises(errors.DatabaseUnavailableError, match="checkout"):
        asyncio.run(checkout())


def test_a_write_refused_by_a_read_only_server_closes_the_connection_in_both_drivers(
    database_url: str,
) -> None:
    """A server that turned read-only refuses every later write on the connections made
    to it: as raised by psycopg (an `atomically` block) or as translated, the error closes
    the connection it came through."""
    db = SystemDB(database_url, "durable")
    db.open()
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            with db.connection() as conn:
                conn.execute("SET default_transaction_read_only = on")
                conn.execute("CREATE TABLE refused ()")
        assert conn.closed

        async def refused() -> bool:
            pool = db.async_pool(2)
            await pool.open(wait=True)
            try:
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    async with db.async_connection(pool) as aconn:
                        await aconn.execute("SET default_transaction_read_only = on")
                        await aconn.execute("CREATE TABLE refused ()")
                return aconn.closed  # (before the pool's close closes every connection)
            finally:
                await pool.close()

        assert asyncio.run(refused())
    finally:
        db.close()


def test_no_connection_for_a_new_event_loop_is_an_outage_as_for_a_new_engine(
    database_url: str,
) -> None:
    """While the database takes no new connections, a new engine fails to launch with
    DatabaseUnavailableError; so does a running engine's first use of a new event loop
    (which opens that loop's pool), not with psycopg_pool's PoolTimeout."""
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="one")
    async def one() -> int:
        return 1

    name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]

    def allow(yes: bool) -> None:
        admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                    sql.Identifier(str(name)), sql.SQL("true" if yes else "false")
                )
            )

    async def start(engine: durable.Engine) -> None:
        await engine.start_async(one)

    with durable.Engine(database_url, registry=reg, connect_timeout=1) as engine:
        allow(False)
        try:
            with pytest.raises(errors.DatabaseUnavailableError):
                durable.Engine(database_url, registry=reg, connect_timeout=1).launch()
            with pytest.raises(errors.DatabaseUnavailableError):
                asyncio.run(start(engine))
        finally:
            allow(True)
